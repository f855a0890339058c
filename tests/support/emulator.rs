//! An in-process emulator on 127.0.0.1:0 with a temp state dir, and a small HTTP client for
//! its control plane, envd unary calls and Connect streams.

use std::io::Read;
use std::net::SocketAddr;
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};
use wmo_e2b::emulator::{Emulator, EmulatorConfig, EmulatorHandle, FaultSpec};

pub const KEY: &str = "e2b_0123456789abcdef";

/// The project's own E2B client pointed at an emulator at `url`, with test-sized waits.
pub fn client_of(url: String) -> std::sync::Arc<wmo_e2b::sandbox::e2b::E2bBackend> {
    client_with(
        url,
        wmo_e2b::sandbox::e2b::E2bOptions {
            create_rate: 100.0,
            request_timeout: Duration::from_secs(20),
            keepalive: Duration::from_secs(2),
            ..wmo_e2b::sandbox::e2b::E2bOptions::default()
        },
    )
}

/// The project's own E2B client pointed at an emulator at `url`, with `options`.
pub fn client_with(
    url: String,
    options: wmo_e2b::sandbox::e2b::E2bOptions,
) -> std::sync::Arc<wmo_e2b::sandbox::e2b::E2bBackend> {
    use wmo_e2b::sandbox::e2b::{E2bBackend, E2bConfig};
    E2bBackend::new(
        E2bConfig {
            api_key: KEY.into(),
            domain: "e2b.test".into(),
            api_base: url.clone(),
            sandbox_url: Some(url),
        },
        options,
    )
    .unwrap()
}

/// An in-process emulator with its state in a temp dir, and the project's own E2B client of
/// it. Fields drop in order: the emulator stops (killing its sandboxes) before the state
/// directory goes.
pub struct Served {
    pub emulator: EmulatorHandle,
    pub backend: std::sync::Arc<wmo_e2b::sandbox::e2b::E2bBackend>,
    _dir: tempfile::TempDir,
}

pub fn serve() -> Served {
    let dir = tempfile::tempdir().expect("tempdir");
    let listen: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let config = EmulatorConfig::new(listen, KEY, dir.path().to_path_buf());
    let emulator = Emulator::start(config).expect("the emulator starts");
    Served {
        backend: client_of(emulator.url()),
        emulator,
        _dir: dir,
    }
}

/// An emulator running in this test process, and a client of it.
pub struct Emu {
    pub handle: EmulatorHandle,
    pub client: Client,
    pub dir: tempfile::TempDir,
}

impl std::ops::Deref for Emu {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

/// An HTTP client of an emulator, with its own connection pool.
pub struct Client {
    pub url: String,
    pub agent: ureq::Agent,
}

impl Client {
    pub fn new(url: &str) -> Client {
        Client {
            url: url.to_string(),
            agent: agent(),
        }
    }
}

pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .max_idle_connections_per_host(64)
        .build()
        .into()
}

pub fn start() -> Emu {
    start_with(FaultSpec::default(), 1)
}

pub fn start_with(faults: FaultSpec, seed: u64) -> Emu {
    start_configured(|config| {
        config.faults = faults;
        config.seed = seed;
    })
}

/// An emulator started with whatever `configure` sets.
pub fn start_configured(configure: impl FnOnce(&mut EmulatorConfig)) -> Emu {
    let dir = tempfile::tempdir().expect("tempdir");
    let listen: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let mut config = EmulatorConfig::new(listen, KEY, dir.path().join("state"));
    configure(&mut config);
    let handle = Emulator::start(config).expect("the emulator starts");
    Emu {
        client: Client::new(&handle.url()),
        handle,
        dir,
    }
}

/// An answer: status, headers (lowercase names), body.
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

fn reply(resp: ureq::http::Response<ureq::Body>) -> Reply {
    let status = resp.status().as_u16();
    let headers = resp
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_ascii_lowercase(),
                v.to_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let mut body = Vec::new();
    resp.into_body()
        .into_reader()
        .read_to_end(&mut body)
        .expect("body");
    Reply {
        status,
        headers,
        body,
    }
}

impl Client {
    /// A control-plane call with the right key (or `key`).
    pub fn api_as(
        &self,
        key: Option<&str>,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Reply {
        let url = format!("{}{path}", self.url);
        let resp = match method {
            "GET" | "DELETE" => {
                let mut req = if method == "GET" {
                    self.agent.get(&url)
                } else {
                    self.agent.delete(&url)
                };
                if let Some(k) = key {
                    req = req.header("X-API-Key", k);
                }
                req.call()
            }
            _ => {
                let mut req = match method {
                    "POST" => self.agent.post(&url),
                    "PUT" => self.agent.put(&url),
                    other => panic!("method {other}"),
                };
                if let Some(k) = key {
                    req = req.header("X-API-Key", k);
                }
                req.send_json(body.unwrap_or_else(|| json!({})))
            }
        };
        reply(resp.expect("the request completes"))
    }

    pub fn api(&self, method: &str, path: &str, body: Option<Value>) -> Reply {
        self.api_as(Some(KEY), method, path, body)
    }

    /// Creates a sandbox (v2) and returns the `Sandbox` JSON.
    pub fn create(&self, body: Value) -> Value {
        let r = self.api("POST", "/v2/sandboxes", Some(body));
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        r.json()
    }

    fn envd_post(
        &self,
        sbx: &Value,
        path: &str,
    ) -> ureq::RequestBuilder<ureq::typestate::WithBody> {
        let mut req = self
            .agent
            .post(format!("{}{path}", self.url))
            .header("E2b-Sandbox-Id", sbx["sandboxID"].as_str().expect("id"))
            .header("E2b-Sandbox-Port", "49983");
        if let Some(token) = sbx["envdAccessToken"].as_str() {
            req = req.header("X-Access-Token", token);
        }
        req
    }

    /// A unary envd RPC (`process.Process/List` and the like).
    pub fn rpc(&self, sbx: &Value, method: &str, body: Value) -> Reply {
        let resp = self
            .envd_post(sbx, &format!("/{method}"))
            .header("Content-Type", "application/json")
            .header("Connect-Protocol-Version", "1")
            .send(body.to_string().as_bytes());
        reply(resp.expect("the request completes"))
    }

    /// Opens a server stream (`process.Process/Start` or `Connect`).
    pub fn open_stream(
        &self,
        sbx: &Value,
        method: &str,
        body: Value,
        headers: &[(&str, &str)],
    ) -> Stream {
        let mut req = self
            .envd_post(sbx, &format!("/{method}"))
            .header("Content-Type", "application/connect+json")
            .header("Connect-Protocol-Version", "1");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = req
            .send(envelope(0, body.to_string().as_bytes()))
            .expect("the stream opens");
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        Stream {
            status,
            content_type,
            reader: Box::new(resp.into_body().into_reader()),
        }
    }

    /// `POST /files{query}` with the sandbox's token: the status and the JSON answer.
    pub fn upload(
        &self,
        sbx: &Value,
        query: &str,
        content_type: &str,
        extra: &[(&str, &str)],
        body: &[u8],
    ) -> (u16, Value) {
        let mut req = self
            .agent
            .post(format!("{}/files{query}", self.url))
            .header("E2b-Sandbox-Id", sbx["sandboxID"].as_str().expect("id"))
            .header(
                "X-Access-Token",
                sbx["envdAccessToken"].as_str().expect("token"),
            )
            .header("Content-Type", content_type);
        for (k, v) in extra {
            req = req.header(*k, *v);
        }
        let resp = req.send(body).expect("the upload completes");
        let status = resp.status().as_u16();
        let v = resp.into_body().read_json().unwrap_or(Value::Null);
        (status, v)
    }

    /// `GET /files?path=` with the sandbox's token: the status and the body.
    pub fn download(&self, sbx: &Value, path: &str) -> (u16, Vec<u8>) {
        let resp = self
            .agent
            .get(format!("{}/files", self.url))
            .query("path", path)
            .header("E2b-Sandbox-Id", sbx["sandboxID"].as_str().expect("id"))
            .header(
                "X-Access-Token",
                sbx["envdAccessToken"].as_str().expect("token"),
            )
            .call()
            .expect("the download completes");
        let status = resp.status().as_u16();
        (status, resp.into_body().read_to_vec().expect("body"))
    }

    /// Runs `cmd` like the SDK's `commands.run` and reads the whole stream.
    pub fn run(&self, sbx: &Value, cmd: &str) -> Vec<Frame> {
        let mut s = self.open_stream(sbx, "process.Process/Start", start_body(cmd, false), &[]);
        assert_eq!(s.status, 200);
        s.read_all()
    }
}

pub fn start_body(cmd: &str, stdin: bool) -> Value {
    json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", cmd]}, "stdin": stdin})
}

pub fn envelope(flag: u8, msg: &[u8]) -> Vec<u8> {
    let mut out = vec![flag];
    out.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    out.extend_from_slice(msg);
    out
}

/// One envelope read off a stream.
#[derive(Debug, Clone)]
pub struct Frame {
    pub flag: u8,
    pub msg: Value,
}

impl Frame {
    pub fn is_end_of_stream(&self) -> bool {
        self.flag & 2 != 0
    }
}

pub struct Stream {
    pub status: u16,
    pub content_type: String,
    reader: Box<dyn Read + Send>,
}

impl Stream {
    /// The next envelope; `None` at a clean or cut end of the body.
    pub fn next_frame(&mut self) -> Option<Frame> {
        let mut head = [0u8; 5];
        self.reader.read_exact(&mut head).ok()?;
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let mut msg = vec![0u8; len];
        self.reader.read_exact(&mut msg).ok()?;
        Some(Frame {
            flag: head[0],
            msg: serde_json::from_slice(&msg).expect("JSON envelope"),
        })
    }

    /// The next envelope that is not a keepalive.
    pub fn next_event(&mut self) -> Option<Frame> {
        loop {
            let f = self.next_frame()?;
            if f.msg["event"].get("keepalive").is_none() {
                return Some(f);
            }
        }
    }

    pub fn read_all(&mut self) -> Vec<Frame> {
        let mut frames = Vec::new();
        while let Some(f) = self.next_frame() {
            let done = f.is_end_of_stream();
            frames.push(f);
            if done {
                break;
            }
        }
        frames
    }
}

/// The stdout (or stderr) bytes of a list of frames.
pub fn output(frames: &[Frame], which: &str) -> String {
    let mut out = Vec::new();
    for f in frames {
        if let Some(d) = f.msg["event"]["data"][which].as_str() {
            out.extend(
                base64::engine::general_purpose::STANDARD
                    .decode(d)
                    .expect("base64"),
            );
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The `end` event of a list of frames.
pub fn end_event(frames: &[Frame]) -> Option<Value> {
    frames
        .iter()
        .find_map(|f| f.msg["event"].get("end").cloned())
}
