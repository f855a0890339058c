//! Benchmark: frame throughput of the stdio channel (what `scripts/bench/run.sh` runs).
//!
//! The same frames as the reference's `bench_channel.py` (a ~200 B `tool_request`, a ~20 KB
//! `llm_request`), cycled from a ring of 64, through the real decoding path:
//!
//! - `recv`: a real [`StdioChannel`] (its reader thread, line splitter, `frame::decode`, the
//!   bounded hand-off) over a fake sandbox whose process events are fed from memory, either
//!   one event per frame (`--chunking frame`) or 64 KiB events that split lines
//!   (`--chunking 64k`), as the reference's fake command handle does; every frame is read
//!   whole, as the broker reads a tool request and the reference hands out a dict;
//! - `route`: `recv`, but frames are only routed (type and id), as the broker handles the
//!   frames it needs no field of, and as a transcript copies them;
//! - `pipe`: the same, but the frames come from a real local-sandbox process (`cat` of a ring
//!   file) through the local backend's pipe readers;
//! - `decode`: line splitting plus `frame::decode` on one thread, no channel (the floor);
//! - `send`: `StdioChannel::send` (encode + `send_stdin`) to a sandbox that drops the bytes.
//!
//! Prints one JSON line: frames/s, MB/s, process CPU seconds, peak RSS.
//!
//! `cargo run --release --example bench_frames -- recv --size small --chunking frame --n 100000`

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use wmo_e2b::channel::frame;
use wmo_e2b::channel::StdioChannel;
use wmo_e2b::sandbox::local::LocalBackend;
use wmo_e2b::sandbox::{
    sink, CreateSpec, Output, OutputSink, Process, ProcessEvent, ProcessInfo, Result as SbResult,
    RunOpts, Sandbox, SandboxError, SpawnOpts,
};

mod bench_common;
use bench_common::arg;

const RING: usize = 64;
const CHUNK: usize = 64 * 1024;

fn small_frame(i: usize) -> Value {
    let mut f = json!({
        "type": "tool_request",
        "req_id": i,
        "name": "bash",
        "arguments": {"command": "ls -la /home/user/workspace && cat README.md | head -n 20"},
        "episode_id": "0123456789abcdef0123456789abcdef",
    });
    // Pad the command so the JSON text is 200 bytes, as in the reference.
    let len = serde_json::to_vec(&f).unwrap().len();
    if len < 200 {
        let pad = 200 - len;
        let cmd = f["arguments"]["command"].as_str().unwrap().to_string();
        f["arguments"]["command"] = json!(format!("{cmd} #{}", "x".repeat(pad.saturating_sub(2))));
    }
    f
}

fn lorem(i: usize) -> String {
    let words: Vec<&str> = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore et dolore magna aliqua \"quoted\" \\ back\nslash "
        .split(' ')
        .collect();
    let mut text = Vec::new();
    let (mut n, mut k) = (0, i);
    while n < 19_400 {
        let w = words[k % words.len()];
        k += 7;
        text.push(w);
        n += w.len() + 1;
    }
    text.join(" ")
}

fn large_frame(i: usize) -> Value {
    json!({
        "type": "llm_request",
        "req_id": i,
        "openai_body": {
            "model": "worker",
            "messages": [
                {"role": "system", "content": "You are a helpful agent."},
                {"role": "user", "content": lorem(i)},
            ],
            "stream": true,
            "max_tokens": 4096,
        },
    })
}

fn send_frame(size: &str, i: usize) -> Value {
    if size == "small" {
        json!({"type": "tool_response", "episode_id": "0123456789abcdef0123456789abcdef",
               "req_id": i, "content": format!("total 8\ndrwxr-xr-x 2 user user 4096 README.md\n{}", "y".repeat(60)),
               "is_error": false})
    } else {
        json!({"type": "llm_response", "episode_id": "0123456789abcdef0123456789abcdef",
               "req_id": i,
               "completion": {"choices": [{"index": 0, "message": {"role": "assistant",
                              "content": lorem(i)}, "finish_reason": "stop"}],
                              "usage": {"prompt_tokens": 100, "completion_tokens": 5000}}})
    }
}

/// A sandbox that accepts writes and drops them; nothing else is used by the channel.
struct NullSandbox;

fn unsupported<T>() -> SbResult<T> {
    Err(SandboxError::Unsupported("bench".into()))
}

impl Sandbox for NullSandbox {
    fn id(&self) -> &str {
        "bench"
    }
    fn home(&self) -> &str {
        "/nonexistent"
    }
    fn system_dir(&self) -> &str {
        "/nonexistent"
    }
    fn seal(&self) -> SbResult<()> {
        unsupported()
    }
    fn reset(&self) -> SbResult<()> {
        unsupported()
    }
    fn stop_agent(&self, _: bool) -> SbResult<()> {
        unsupported()
    }
    fn run(&self, _: &str, _: &RunOpts) -> SbResult<Output> {
        unsupported()
    }
    fn spawn_into(&self, _: &str, _: &SpawnOpts, _: Box<dyn OutputSink>) -> SbResult<u32> {
        unsupported()
    }
    fn connect(&self, _: u32) -> SbResult<Process> {
        unsupported()
    }
    fn send_stdin(&self, _: u32, data: &[u8]) -> SbResult<()> {
        std::hint::black_box(data);
        Ok(())
    }
    fn close_stdin(&self, _: u32) -> SbResult<()> {
        Ok(())
    }
    fn processes(&self) -> SbResult<Vec<ProcessInfo>> {
        Ok(Vec::new())
    }
    fn kill_process(&self, _: u32) -> SbResult<()> {
        Ok(())
    }
    fn read_file(&self, _: &str) -> SbResult<Vec<u8>> {
        unsupported()
    }
    fn write_file(&self, _: &str, _: &[u8]) -> SbResult<()> {
        unsupported()
    }
    fn set_timeout(&self, _: u64) -> SbResult<()> {
        Ok(())
    }
    fn set_internet(&self, _: bool) -> SbResult<()> {
        Ok(())
    }
}

/// utime + stime of this process, seconds.
fn cpu_s() -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn peak_rss_kb() -> u64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    ru.ru_maxrss as u64
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let op = args.first().cloned().unwrap_or_else(|| "recv".into());
    let size = arg(&args, "--size", "small");
    let chunking = arg(&args, "--chunking", "frame");
    let n: usize = arg(&args, "--n", "100000").parse().expect("--n");
    assert!(size == "small" || size == "large", "--size small|large");

    let frames: Vec<Value> = (0..RING)
        .map(|i| match (op.as_str(), size.as_str()) {
            ("send", s) => send_frame(s, i),
            (_, "small") => small_frame(i),
            _ => large_frame(i),
        })
        .collect();
    let json_bytes = frames
        .iter()
        .map(|f| serde_json::to_vec(f).unwrap().len())
        .sum::<usize>() as f64
        / RING as f64;
    let lines: Vec<Vec<u8>> = frames.iter().map(frame::encode).collect();
    let wire_bytes = lines.iter().map(Vec::len).sum::<usize>() as f64 / RING as f64;

    let (n, seconds, cpu) = match op.as_str() {
        "recv" => bench_recv(&lines, n, &chunking, true),
        "route" => bench_recv(&lines, n, &chunking, false),
        "pipe" => bench_pipe(&lines, n),
        "decode" => bench_decode(&lines, n),
        "send" => bench_send(&frames, n),
        other => panic!("unknown op {other}: recv|pipe|decode|send"),
    };
    let out = json!({
        "impl": "wmo-e2b",
        "op": op,
        "size": size,
        "chunking": if op == "recv" || op == "route" { chunking.as_str() } else { "-" },
        "n": n,
        "json_bytes_per_frame": json_bytes.round(),
        "wire_bytes_per_frame": wire_bytes.round(),
        "seconds": seconds,
        "frames_per_s": n as f64 / seconds,
        "wire_MB_per_s": n as f64 * wire_bytes / seconds / 1e6,
        "json_MB_per_s": n as f64 * json_bytes / seconds / 1e6,
        "cpu_s": cpu,
        "peak_rss_kb": peak_rss_kb(),
    });
    println!("{out}");
}

fn check_last(f: &frame::Frame, n: usize) {
    let want = ((n - 1) % RING) as u64;
    assert_eq!(f.req_id(), Some(want), "last frame");
}

/// A real channel over in-memory process events.
/// `whole`: every frame is read whole, as the broker reads a tool or model request (and as
/// the reference hands out a dict); without it frames are only routed, by type and id.
fn bench_recv(lines: &[Vec<u8>], n: usize, chunking: &str, whole: bool) -> (usize, f64, f64) {
    // The feeder stands where a backend's reading thread stands: it hands each chunk to the
    // channel's sink, which cuts it into frames there.
    let (mut channel, mut sink) = StdioChannel::fed(Arc::new(NullSandbox), 4242, None);
    let events: Vec<Vec<u8>> = lines.to_vec();
    let chunked = chunking == "64k";
    let cpu0 = cpu_s();
    let t0 = Instant::now();
    let feeder = std::thread::spawn(move || {
        let mut feed =
            |chunk: Vec<u8>| sink::deliver(&mut sink, ProcessEvent::Stdout(chunk), &mut || true);
        if !chunked {
            for i in 0..n {
                if !feed(events[i % RING].clone()) {
                    return;
                }
            }
        } else {
            let mut buf: Vec<u8> = Vec::with_capacity(2 * CHUNK);
            for i in 0..n {
                buf.extend_from_slice(&events[i % RING]);
                while buf.len() >= CHUNK {
                    let rest = buf.split_off(CHUNK);
                    let chunk = std::mem::replace(&mut buf, rest);
                    if !feed(chunk) {
                        return;
                    }
                }
            }
            if !buf.is_empty() {
                feed(buf);
            }
        }
        // Dropping the sink ends the stream only after every frame sent through it.
    });
    let mut last = None;
    for _ in 0..n {
        let f = channel
            .recv(Duration::from_secs(60))
            .expect("recv")
            .expect("frame");
        if whole {
            std::hint::black_box(f.body());
        }
        last = Some(f);
    }
    let seconds = t0.elapsed().as_secs_f64();
    let cpu = cpu_s() - cpu0;
    check_last(last.as_ref().unwrap(), n);
    feeder.join().unwrap();
    (n, seconds, cpu)
}

/// A real channel over a real local-sandbox process that `cat`s the frames.
fn bench_pipe(lines: &[Vec<u8>], n: usize) -> (usize, f64, f64) {
    let state = tempfile::tempdir().unwrap();
    let backend = LocalBackend::open(state.path()).unwrap();
    let sandbox: Arc<dyn Sandbox> = backend
        .create_local(&CreateSpec {
            timeout_secs: 3600,
            internet: true,
            ..CreateSpec::default()
        })
        .unwrap();
    let ring: Vec<u8> = lines.concat();
    let home = sandbox.home().to_string();
    sandbox
        .write_file(&format!("{home}/ring.txt"), &ring)
        .unwrap();
    let reps = n.div_ceil(RING);
    let n = reps * RING;
    let cmd = format!("cat {}", vec!["ring.txt"; reps].join(" "));
    let cpu0 = cpu_s();
    let t0 = Instant::now();
    let mut channel =
        StdioChannel::spawn(sandbox.clone(), &cmd, &SpawnOpts::default(), None).unwrap();
    let mut last = None;
    for _ in 0..n {
        let f = channel
            .recv(Duration::from_secs(60))
            .expect("recv")
            .expect("frame");
        // Read whole, as `recv` reads them.
        std::hint::black_box(f.body());
        last = Some(f);
    }
    let seconds = t0.elapsed().as_secs_f64();
    let cpu = cpu_s() - cpu0;
    check_last(last.as_ref().unwrap(), n);
    drop(channel);
    use wmo_e2b::sandbox::Backend;
    let _ = backend.kill(sandbox.id());
    (n, seconds, cpu)
}

/// Line splitting + `frame::decode` on one thread, input pre-joined in 64 KiB-ish buffers.
fn bench_decode(lines: &[Vec<u8>], n: usize) -> (usize, f64, f64) {
    let ring: Vec<u8> = lines.concat();
    let cpu0 = cpu_s();
    let t0 = Instant::now();
    let mut last = None;
    let mut done = 0;
    while done < n {
        let mut rest: &[u8] = &ring;
        while let Some(nl) = memchr::memchr(b'\n', rest) {
            if done == n {
                break;
            }
            last = Some(frame::decode(&rest[..nl]).expect("decode"));
            rest = &rest[nl + 1..];
            done += 1;
        }
    }
    let seconds = t0.elapsed().as_secs_f64();
    let cpu = cpu_s() - cpu0;
    check_last(last.as_ref().unwrap(), n);
    (n, seconds, cpu)
}

/// `StdioChannel::send` to a sandbox that drops the bytes.
fn bench_send(frames: &[Value], n: usize) -> (usize, f64, f64) {
    let (channel, _sink) = StdioChannel::fed(Arc::new(NullSandbox), 4242, None);
    let cpu0 = cpu_s();
    let t0 = Instant::now();
    for i in 0..n {
        channel.send(&frames[i % RING]).expect("send");
    }
    let seconds = t0.elapsed().as_secs_f64();
    (n, seconds, cpu_s() - cpu0)
}
