//! Every engine's variable sets, and each way one can be wrong.

use super::*;

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn auto(count: Option<u32>, pairs: &[(&str, &str)]) -> Result<Shard, ShardError> {
    resolve(ShardSpec::Auto { count }, &env(pairs))
}

fn shard(index: u32, count: u32) -> Shard {
    Shard { index, count }
}

/// The error, which must name `var` in what the user reads.
fn refused(count: Option<u32>, pairs: &[(&str, &str)], var: &str) -> ShardError {
    let e = auto(count, pairs).expect_err("refused");
    assert!(e.to_string().contains(var), "{e} does not name {var}");
    e
}

#[test]
fn spec_is_i_of_n_auto_or_auto_of_n() {
    assert_eq!(parse("0/4"), Ok(ShardSpec::Fixed(shard(0, 4))));
    assert_eq!(parse(" 3 / 4 "), Ok(ShardSpec::Fixed(shard(3, 4))));
    assert_eq!(parse("auto"), Ok(ShardSpec::Auto { count: None }));
    assert_eq!(parse("auto/8"), Ok(ShardSpec::Auto { count: Some(8) }));
    for bad in [
        "4/4", "1/0", "x/2", "1", "-1/2", "", "auto/", "auto/0", "auto/x", "auto/-2", "Auto",
        "auto/4/1",
    ] {
        assert_eq!(
            parse(bad),
            Err(ShardError::Syntax { given: bad.into() }),
            "{bad}"
        );
    }
}

#[test]
fn a_fixed_shard_ignores_the_engine() {
    let e = env(&[(K8S_INDEX, "3"), (SLURM_ID, "junk")]);
    assert_eq!(resolve(ShardSpec::Fixed(shard(1, 2)), &e), Ok(shard(1, 2)));
}

#[test]
fn kubernetes_gives_the_index_and_auto_n_the_count() {
    for i in 0..4u32 {
        let got = auto(Some(4), &[(K8S_INDEX, &i.to_string())]);
        assert_eq!(got, Ok(shard(i, 4)));
    }
    let e = refused(None, &[(K8S_INDEX, "0")], K8S_INDEX);
    assert!(e.to_string().contains("auto/N"), "{e}");
    assert!(matches!(e, ShardError::NoCount { .. }), "{e:?}");
    let e = refused(Some(4), &[(K8S_INDEX, "4")], K8S_INDEX);
    assert!(
        matches!(
            e,
            ShardError::OutOfRange {
                index: 4,
                count: 4,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn slurm_index_is_id_minus_min_checked_against_count_and_max() {
    let full = |id: &str| {
        vec![
            (SLURM_ID, id.to_string()),
            (SLURM_MIN, "3".to_string()),
            (SLURM_MAX, "6".to_string()),
            (SLURM_COUNT, "4".to_string()),
        ]
    };
    for id in 3..=6u32 {
        let pairs = full(&id.to_string());
        let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(auto(None, &pairs), Ok(shard(id - 3, 4)));
        // auto/N agreeing with the array is the same shard.
        assert_eq!(auto(Some(4), &pairs), Ok(shard(id - 3, 4)));
    }
    // Without MAX or COUNT the count comes from auto/N alone.
    let minimal = [(SLURM_ID, "1"), (SLURM_MIN, "0")];
    assert_eq!(auto(Some(2), &minimal), Ok(shard(1, 2)));
    let e = refused(None, &minimal, SLURM_ID);
    assert!(matches!(e, ShardError::NoCount { .. }), "{e:?}");

    let e = refused(
        Some(5),
        &[(SLURM_ID, "0"), (SLURM_MIN, "0"), (SLURM_COUNT, "4")],
        SLURM_COUNT,
    );
    assert!(matches!(e, ShardError::Inconsistent { .. }), "{e:?}");
    let e = refused(None, &[(SLURM_ID, "0"), (SLURM_COUNT, "4")], SLURM_MIN);
    assert!(matches!(e, ShardError::Missing { .. }), "{e:?}");
    let e = refused(
        None,
        &[(SLURM_ID, "2"), (SLURM_MIN, "3"), (SLURM_COUNT, "4")],
        SLURM_ID,
    );
    assert!(matches!(e, ShardError::Inconsistent { .. }), "{e:?}");
    // --array=0-6:2: four tasks spread over seven indexes.
    let stepped = [
        (SLURM_ID, "2"),
        (SLURM_MIN, "0"),
        (SLURM_MAX, "6"),
        (SLURM_COUNT, "4"),
    ];
    let e = refused(None, &stepped, SLURM_MAX);
    assert!(e.to_string().contains("--array=0-3"), "{e}");
    // The same stepped array without MAX still cannot pass its count.
    let e = refused(
        None,
        &[(SLURM_ID, "6"), (SLURM_MIN, "0"), (SLURM_COUNT, "4")],
        SLURM_ID,
    );
    assert!(
        matches!(e, ShardError::OutOfRange { index: 6, .. }),
        "{e:?}"
    );
    let e = refused(
        None,
        &[(SLURM_ID, "0"), (SLURM_MIN, "0"), (SLURM_COUNT, "0")],
        SLURM_COUNT,
    );
    assert!(matches!(e, ShardError::Inconsistent { .. }), "{e:?}");
    refused(
        None,
        &[
            (SLURM_ID, "0"),
            (SLURM_MIN, "0"),
            (SLURM_MAX, "2"),
            (SLURM_COUNT, "2"),
        ],
        SLURM_MAX,
    );
    refused(
        None,
        &[
            (SLURM_ID, "0"),
            (SLURM_MIN, "2"),
            (SLURM_MAX, "1"),
            (SLURM_COUNT, "1"),
        ],
        SLURM_ID,
    );
}

#[test]
fn aws_batch_count_comes_from_auto_n_or_the_array_size() {
    for i in 0..3u32 {
        let idx = i.to_string();
        assert_eq!(auto(Some(3), &[(AWS_INDEX, &idx)]), Ok(shard(i, 3)));
        assert_eq!(
            auto(None, &[(AWS_INDEX, &idx), (AWS_SIZE, "3")]),
            Ok(shard(i, 3))
        );
        assert_eq!(
            auto(Some(3), &[(AWS_INDEX, &idx), (AWS_SIZE, "3")]),
            Ok(shard(i, 3))
        );
    }
    let e = refused(None, &[(AWS_INDEX, "0")], AWS_INDEX);
    assert!(matches!(e, ShardError::NoCount { .. }), "{e:?}");
    let e = refused(Some(2), &[(AWS_INDEX, "0"), (AWS_SIZE, "3")], AWS_SIZE);
    assert!(matches!(e, ShardError::Inconsistent { .. }), "{e:?}");
    let e = refused(None, &[(AWS_INDEX, "3"), (AWS_SIZE, "3")], AWS_INDEX);
    assert!(e.to_string().contains(AWS_SIZE), "{e}");
    assert!(matches!(e, ShardError::OutOfRange { .. }), "{e:?}");
}

#[test]
fn a_malformed_variable_is_refused_naming_it() {
    let cases: &[(&str, &[(&str, &str)])] = &[
        (K8S_INDEX, &[]),
        (SLURM_ID, &[(SLURM_MIN, "0"), (SLURM_COUNT, "2")]),
        (SLURM_MIN, &[(SLURM_ID, "0"), (SLURM_COUNT, "2")]),
        (
            SLURM_MAX,
            &[(SLURM_ID, "0"), (SLURM_MIN, "0"), (SLURM_COUNT, "2")],
        ),
        (SLURM_COUNT, &[(SLURM_ID, "0"), (SLURM_MIN, "0")]),
        (AWS_INDEX, &[(AWS_SIZE, "2")]),
        (AWS_SIZE, &[(AWS_INDEX, "0")]),
    ];
    for &(var, others) in cases {
        for (value, negative) in [
            ("-1", true),
            ("abc", false),
            ("", false),
            (" 1", false),
            ("+1", false),
            ("1.0", false),
            ("99999999999999999999999", false),
        ] {
            let mut pairs = others.to_vec();
            pairs.push((var, value));
            let e = refused(Some(2), &pairs, var);
            if negative {
                assert!(
                    matches!(e, ShardError::Negative { .. }),
                    "{var}={value}: {e:?}"
                );
            } else {
                assert!(
                    matches!(e, ShardError::NotANumber { .. }),
                    "{var}={value}: {e:?}"
                );
            }
        }
    }
    // A number too large for a shard is out of range, not wrapped around.
    let e = refused(Some(2), &[(K8S_INDEX, "4294967296")], K8S_INDEX);
    assert!(matches!(e, ShardError::OutOfRange { .. }), "{e:?}");
}

#[test]
fn no_engine_is_refused() {
    for pairs in [
        &[][..],
        &[("SLURM_JOB_ID", "7"), ("KUBERNETES_SERVICE_HOST", "x")][..],
    ] {
        let e = auto(Some(4), pairs).expect_err("no engine");
        assert_eq!(e, ShardError::NoEngine);
        for var in [K8S_INDEX, SLURM_ID, AWS_INDEX] {
            assert!(e.to_string().contains(var), "{e}");
        }
    }
}

#[test]
fn two_engines_must_agree() {
    let both = [(K8S_INDEX, "1"), (AWS_INDEX, "1"), (AWS_SIZE, "4")];
    assert_eq!(auto(Some(4), &both), Ok(shard(1, 4)));
    let split = [
        (K8S_INDEX, "1"),
        (SLURM_ID, "2"),
        (SLURM_MIN, "0"),
        (SLURM_COUNT, "4"),
    ];
    let e = refused(Some(4), &split, K8S_INDEX);
    assert!(e.to_string().contains(SLURM_ID), "{e}");
    assert!(matches!(e, ShardError::Disagree { .. }), "{e:?}");
    // A bad variable of one engine is refused even when another's are fine.
    refused(Some(4), &[(K8S_INDEX, "1"), (AWS_INDEX, "x")], AWS_INDEX);
}

#[test]
fn a_shard_holds_its_ids_and_names_its_directory() {
    let s = shard(2, 5);
    assert_eq!(s.dir_name(), "shard-2-of-5");
    for id in ["a", "t0", "task-042", "add"] {
        assert_eq!(s.holds(id), task::shard_of(id, 5) == 2, "{id}");
    }
}
