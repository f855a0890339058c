//! The stdio channel over a real local process: garbage, oversized lines, keepalives, exits.

use std::time::Duration;

use serde_json::json;
use wmo_e2b::channel::{frame, ChannelError, StdioChannel};
use wmo_e2b::sandbox::{Backend, SpawnOpts};

mod support;

use support::local_sandbox;

fn line(v: serde_json::Value) -> String {
    String::from_utf8(frame::encode(&v)).unwrap()
}

#[test]
fn garbage_and_oversized_lines_become_diagnostics_and_frames_still_flow() {
    let dir = tempfile::tempdir().unwrap();
    let (backend, sb) = local_sandbox(dir.path());
    let hello = line(json!({"type": "hello", "protocol": 1}));
    let keep = line(json!({"type": "transport_keepalive"}));
    let after = line(json!({"type": "tool_request", "req_id": 1, "name": "bash"}));
    let script = format!("{}/script", sb.home());
    sb.write_file(
        &script,
        format!(
            "printf '%s' '{hello}'\necho 'console noise on stdout'\n\
             head -c 70000000 /dev/zero | tr '\\0' 'A'; echo\n\
             printf '%s' '{keep}'\nprintf '%s' '{after}'\necho 'to stderr' >&2\nsleep 1\nexit 7\n"
        )
        .as_bytes(),
    )
    .unwrap();
    let cmd = format!("bash {script}");
    let mut ch = StdioChannel::spawn(sb.clone(), &cmd, &SpawnOpts::default(), None).unwrap();
    let first = ch.recv(Duration::from_secs(20)).unwrap().unwrap();
    assert_eq!(first["type"], "hello");
    // The keepalive is consumed by the channel; the next frame is the request.
    let second = ch.recv(Duration::from_secs(20)).unwrap().unwrap();
    assert_eq!(second["type"], "tool_request");
    let err = ch.recv(Duration::from_secs(20)).unwrap_err();
    match &err {
        ChannelError::Exited { code, stderr_tail } => {
            assert_eq!(*code, Some(7));
            assert!(
                stderr_tail.contains("[stdout] console noise"),
                "{stderr_tail}"
            );
            assert!(
                stderr_tail.contains("70000000-byte stdout line"),
                "{stderr_tail}"
            );
            assert!(stderr_tail.contains("to stderr"), "{stderr_tail}");
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("exit 7"), "{err}");
    // The end is sticky.
    assert!(matches!(
        ch.recv(Duration::from_millis(10)),
        Err(ChannelError::Exited { .. })
    ));
    let _ = backend.kill(sb.id());
}

#[test]
fn a_closed_channel_reads_as_a_clean_end() {
    let dir = tempfile::tempdir().unwrap();
    let (backend, sb) = local_sandbox(dir.path());
    let stdin = SpawnOpts {
        stdin: true,
        ..SpawnOpts::default()
    };
    let mut ch = StdioChannel::spawn(sb.clone(), "cat > /dev/null", &stdin, None).unwrap();
    assert!(matches!(
        ch.recv(Duration::from_millis(50)),
        Err(ChannelError::Timeout { .. })
    ));
    ch.close();
    ch.close();
    sb.close_stdin(ch.pid()).unwrap();
    assert!(ch.recv(Duration::from_secs(10)).unwrap().is_none());
    let _ = backend.kill(sb.id());
}
