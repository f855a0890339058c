//! `--shard I/N` gives each host of a multi-host run the tasks whose `shard_of(id, N)` is I:
//! FNV-1a (64-bit) of the id's UTF-8 bytes, modulo N. Hosts may run different builds, so the
//! split is pinned to hashes known from outside this crate: a changed hash would silently
//! run some tasks twice and others never.

use wmo_e2b::task::shard_of;

/// FNV-1a 64 of each id. The first three are the FNV reference test vectors; the rest were
/// computed with a standalone implementation of the published algorithm.
const KNOWN: &[(&str, u64)] = &[
    ("", 0xcbf2_9ce4_8422_2325),
    ("a", 0xaf63_dc4c_8601_ec8c),
    ("foobar", 0x8594_4171_f739_67e8),
    ("add", 0xe70b_c319_0530_e654),
    ("t0", 0x08c8_0007_b56a_5fc9),
    ("t11", 0x5634_8119_43bd_fc45),
    ("task-042", 0xbcf4_e8c6_a17c_dc5f),
    ("naïve/ünïcode", 0x94d5_6309_faeb_9f90),
];

#[test]
fn a_task_lands_on_fnv1a_of_its_id_modulo_the_shard_count() {
    // u32::MAX shards exposes 32 bits of the hash, not just its last few.
    for shards in [1, 2, 3, 4, 7, 16, u32::MAX] {
        for &(id, hash) in KNOWN {
            assert_eq!(
                u64::from(shard_of(id, shards)),
                hash % u64::from(shards),
                "{id:?} over {shards} shards"
            );
        }
    }
}
