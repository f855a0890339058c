//! A real registry for the image tests: Debian's `docker-registry` (the CNCF distribution
//! registry) on a loopback port with its storage in a temp dir, images pushed to it with
//! `buildah`, and a loopback front that forwards to it while misbehaving on demand (a bearer
//! challenge, 429s, corrupted or truncated blobs) and counts what it was asked.
//!
//! Include it with `#[path = "support/registry.rs"] mod registry;` beside `mod support;`.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Fails naming the Debian package when a tool is missing: these tests never skip.
pub fn require(tool: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).is_file()));
    assert!(
        found,
        "`{tool}` is missing: install the Debian package `{package}` (scripts/system-deps.sh)"
    );
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `docker-registry serve` on a loopback port; killed on drop.
pub struct Registry {
    child: Child,
    pub addr: String,
    pub dir: tempfile::TempDir,
}

impl Registry {
    pub fn start() -> Registry {
        Registry::start_with(None)
    }

    /// A registry that demands basic credentials: `htpasswd` is `user:bcrypt-hash`.
    pub fn start_with(htpasswd: Option<&str>) -> Registry {
        require("docker-registry", "docker-registry");
        let dir = tempfile::tempdir().unwrap();
        let mut auth = String::new();
        if let Some(line) = htpasswd {
            let file = dir.path().join("htpasswd");
            std::fs::write(&file, format!("{line}\n")).unwrap();
            auth = format!(
                "auth:\n  htpasswd:\n    realm: test\n    path: {}\n",
                file.display()
            );
        }
        // The port is free when asked; another process taking it before the registry binds
        // makes the readiness wait fail, and the test with it, loudly.
        let addr = format!("127.0.0.1:{}", free_port());
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n  \
                 delete:\n    enabled: true\nhttp:\n  addr: {addr}\n{auth}",
                dir.path().join("data").display()
            ),
        )
        .unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let registry = Registry { child, addr, dir };
        let ready = super::support::eventually(Duration::from_secs(30), || {
            TcpStream::connect(&registry.addr).is_ok()
        });
        assert!(ready, "docker-registry did not listen on {}", registry.addr);
        registry
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An image built with buildah from scratch: `/bin/busybox` plus a config, in its own
/// storage (vfs, so it needs no overlay mounts).
pub struct Buildah {
    pub root: tempfile::TempDir,
}

impl Buildah {
    pub fn new() -> Buildah {
        require("buildah", "buildah");
        assert!(
            Path::new("/bin/busybox").is_file(),
            "/bin/busybox is missing: install the Debian package `busybox-static`"
        );
        Buildah {
            root: tempfile::tempdir().unwrap(),
        }
    }

    fn run(&self, args: &[&str]) -> String {
        let root = self.root.path();
        let out = Command::new("buildah")
            .arg("--root")
            .arg(root.join("root"))
            .arg("--runroot")
            .arg(root.join("run"))
            .args(["--storage-driver", "vfs"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "buildah {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Builds the test image and pushes it to `registry` as `repo:tag` (with `creds`
    /// `user:pass` when the registry wants them).
    pub fn push_busybox(&self, registry: &str, repo_tag: &str, creds: Option<&str>) {
        let c = self.run(&["from", "scratch"]);
        self.run(&["copy", &c, "/bin/busybox", "/bin/busybox"]);
        self.run(&[
            "config",
            "--env",
            "GREETING=hello from the image",
            "--workingdir",
            "/work",
            "--user",
            "1000:1000",
            "--entrypoint",
            r#"["/bin/busybox"]"#,
            "--cmd",
            "sh",
            &c,
        ]);
        let image = format!("img-{}", repo_tag.replace(['/', ':'], "-"));
        self.run(&["commit", "--quiet", &c, &image]);
        let dest = format!("docker://{registry}/{repo_tag}");
        let mut args = vec!["push", "--quiet", "--tls-verify=false"];
        if let Some(creds) = creds {
            args.extend(["--creds", creds]);
        }
        args.extend([image.as_str(), dest.as_str()]);
        self.run(&args);
    }
}

impl Buildah {
    /// Pushes an image of `tree` (copied to `/` as it is, symlinks and all) with `config`
    /// (`buildah config` options) to `registry` as `repo:tag`.
    pub fn push_tree(&self, registry: &str, repo_tag: &str, tree: &Path, config: &[&str]) {
        let c = self.run(&["from", "scratch"]);
        self.run(&["copy", &c, &tree.to_string_lossy(), "/"]);
        let mut args = vec!["config"];
        args.extend(config);
        args.push(&c);
        self.run(&args);
        let image = format!("img-{}", repo_tag.replace(['/', ':'], "-"));
        self.run(&["commit", "--quiet", &c, &image]);
        let dest = format!("docker://{registry}/{repo_tag}");
        self.run(&["push", "--quiet", "--tls-verify=false", &image, &dest]);
    }
}

impl Buildah {
    /// Pushes a base image for builds to `registry` as `repo:tag` and returns its reference:
    /// busybox as `/bin/sh` and the applets a Dockerfile's `RUN` and a task's scripts use,
    /// an `/etc/passwd` naming `app` (uid 1000), and `PATH` set.
    pub fn push_base(&self, registry: &str, repo_tag: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for d in ["bin", "etc", "tmp"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
        for applet in [
            "sh", "cat", "echo", "mkdir", "test", "[", "id", "pwd", "ls", "rm", "cp", "mv",
            "chmod", "chown", "sleep", "printf", "grep", "awk", "sed", "tr", "env", "true",
            "false",
        ] {
            std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
        }
        std::fs::write(
            root.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n",
        )
        .unwrap();
        std::fs::write(root.join("etc/group"), "root:x:0:\napp:x:1000:\n").unwrap();
        self.push_tree(registry, repo_tag, root, &["--env", "PATH=/bin"]);
        format!("{registry}/{repo_tag}")
    }
}

/// How the front misbehaves.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Demand `Authorization: Bearer <token>`, handed out at `/token`.
    pub bearer: Option<String>,
    /// The challenge's realm, instead of the front's own `/token`.
    pub realm: Option<String>,
    /// Answer this many requests 429 with `Retry-After: 1` first.
    pub throttle: usize,
    /// Flip a byte in every blob body.
    pub corrupt_blobs: bool,
    /// Send half of every blob body under the whole `Content-Length`, then close.
    pub truncate_blobs: bool,
    /// Answer every blob GET with a 307 to `/moved/...` on the front, which serves it.
    pub redirect_blobs: bool,
}

/// What the front was asked, in order: (method, path, when).
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub status: u16,
    pub at: Instant,
}

/// A loopback HTTP front forwarding to a registry.
pub struct Front {
    pub addr: String,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
}

impl Front {
    pub fn start(upstream: &str, faults: Faults) -> Front {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let state = Arc::new(FrontState {
            upstream: upstream.to_string(),
            addr: addr.clone(),
            faults,
            throttled: Mutex::new(0),
            seen: seen.clone(),
            agent: ureq::Agent::config_builder()
                .http_status_as_error(false)
                .max_redirects(0)
                .build()
                .new_agent(),
        });
        let stop2 = stop.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let state = state.clone();
                std::thread::spawn(move || {
                    let _ = state.serve(conn);
                });
            }
        });
        Front { addr, seen, stop }
    }

    /// GETs of paths containing `part`.
    pub fn count(&self, part: &str) -> usize {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.path.contains(part))
            .count()
    }

    /// GETs of each blob, by digest.
    pub fn blob_gets(&self) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for s in self.seen.lock().unwrap().iter() {
            if let Some((_, digest)) = s.path.split_once("/blobs/") {
                *counts.entry(digest.to_string()).or_default() += 1;
            }
        }
        counts
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(&self.addr);
    }
}

struct FrontState {
    upstream: String,
    addr: String,
    faults: Faults,
    throttled: Mutex<usize>,
    seen: Arc<Mutex<Vec<Seen>>>,
    agent: ureq::Agent,
}

impl FrontState {
    fn serve(&self, conn: TcpStream) -> std::io::Result<()> {
        conn.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut reader = BufReader::new(conn.try_clone()?);
        let mut head = String::new();
        let mut line = String::new();
        while reader.read_line(&mut line)? > 2 && head.len() < 65536 {
            head.push_str(&line);
            line.clear();
        }
        let mut lines = head.lines();
        let request_line = lines.next().unwrap_or_default().to_string();
        let path = request_line.split(' ').nth(1).unwrap_or("/").to_string();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let header = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let Answer {
            status,
            headers: extra,
            body,
            declared,
        } = self.answer(&path, header("accept"), header("authorization"));
        self.seen.lock().unwrap().push(Seen {
            path: path.clone(),
            status,
            at: Instant::now(),
        });
        let mut out = conn;
        let mut response = format!(
            "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n",
            declared.unwrap_or(body.len())
        );
        for (k, v) in extra {
            response.push_str(&format!("{k}: {v}\r\n"));
        }
        response.push_str("\r\n");
        out.write_all(response.as_bytes())?;
        out.write_all(&body)?;
        out.flush()
    }

    fn answer(&self, path: &str, accept: Option<String>, authorization: Option<String>) -> Answer {
        if let Some(token) = &self.faults.bearer {
            if path.starts_with("/token") {
                let body = format!(r#"{{"token":"{token}"}}"#).into_bytes();
                return Answer::new(
                    200,
                    vec![("Content-Type".into(), "application/json".into())],
                    body,
                );
            }
            if authorization.as_deref() != Some(&format!("Bearer {token}")) {
                let realm = (self.faults.realm.clone())
                    .unwrap_or_else(|| format!("http://{}/token", self.addr));
                let challenge = format!(
                    r#"Bearer realm="{realm}",service="front",scope="repository:test:pull""#
                );
                return Answer::new(
                    401,
                    vec![("WWW-Authenticate".into(), challenge)],
                    Vec::new(),
                );
            }
        }
        if self.faults.redirect_blobs && path.contains("/blobs/") && !path.starts_with("/moved/") {
            let location = format!("http://{}/moved{path}", self.addr);
            return Answer::new(307, vec![("Location".into(), location)], Vec::new());
        }
        let path = path.strip_prefix("/moved").unwrap_or(path);
        {
            let mut throttled = self.throttled.lock().unwrap();
            if *throttled < self.faults.throttle {
                *throttled += 1;
                return Answer::new(429, vec![("Retry-After".into(), "1".into())], Vec::new());
            }
        }
        let mut request = self.agent.get(format!("http://{}{path}", self.upstream));
        if let Some(accept) = accept {
            request = request.header("Accept", accept);
        }
        let Ok(mut response) = request.call() else {
            return Answer::new(502, Vec::new(), Vec::new());
        };
        let status = response.status().as_u16();
        let mut headers = Vec::new();
        for name in [
            "content-type",
            "docker-content-digest",
            "www-authenticate",
            "location",
        ] {
            if let Some(v) = response.headers().get(name).and_then(|v| v.to_str().ok()) {
                headers.push((name.to_string(), v.to_string()));
            }
        }
        let mut body = Vec::new();
        let _ = response.body_mut().as_reader().read_to_end(&mut body);
        let mut declared = None;
        if path.contains("/blobs/") && status == 200 && !body.is_empty() {
            if self.faults.corrupt_blobs {
                let mid = body.len() / 2;
                body[mid] ^= 0x55;
            }
            if self.faults.truncate_blobs {
                declared = Some(body.len());
                body.truncate(body.len() / 2);
            }
        }
        Answer {
            status,
            headers,
            body,
            declared,
        }
    }
}

struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// A `Content-Length` other than the body's.
    declared: Option<usize>,
}

impl Answer {
    fn new(status: u16, headers: Vec<(String, String)>, body: Vec<u8>) -> Answer {
        Answer {
            status,
            headers,
            body,
            declared: None,
        }
    }
}

/// Uploads `bytes` as a blob of `repo` through the distribution API (a monolithic upload).
pub fn upload_blob(registry: &str, repo: &str, bytes: &[u8]) -> String {
    let digest = format!("sha256:{}", wmo_e2b::digest::sha256_hex(bytes));
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .new_agent();
    let started = agent
        .post(format!("http://{registry}/v2/{repo}/blobs/uploads/"))
        .send_empty()
        .unwrap();
    assert_eq!(started.status().as_u16(), 202);
    let location = started.headers()["location"].to_str().unwrap().to_string();
    let location = if location.starts_with("http") {
        location
    } else {
        format!("http://{registry}{location}")
    };
    let sep = if location.contains('?') { '&' } else { '?' };
    let put = agent
        .put(format!("{location}{sep}digest={digest}"))
        .header("Content-Type", "application/octet-stream")
        .send(bytes)
        .unwrap();
    assert_eq!(put.status().as_u16(), 201, "blob upload");
    digest
}

/// Puts a manifest (or index) under `reference` (a tag or a digest); returns its digest.
pub fn put_manifest(
    registry: &str,
    repo: &str,
    reference: &str,
    media_type: &str,
    body: &[u8],
) -> String {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .new_agent();
    let mut put = agent
        .put(format!("http://{registry}/v2/{repo}/manifests/{reference}"))
        .header("Content-Type", media_type)
        .send(body)
        .unwrap();
    let status = put.status().as_u16();
    let text = put.body_mut().read_to_string().unwrap_or_default();
    assert_eq!(status, 201, "manifest put: {text}");
    format!("sha256:{}", wmo_e2b::digest::sha256_hex(body))
}

/// The manifest the registry holds under `reference`, as bytes, with its content type.
pub fn get_manifest(registry: &str, repo: &str, reference: &str) -> (Vec<u8>, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .new_agent();
    let mut got = agent
        .get(format!("http://{registry}/v2/{repo}/manifests/{reference}"))
        .header("Accept", wmo_e2b::image::manifest::MANIFEST_ACCEPT)
        .call()
        .unwrap();
    assert_eq!(got.status().as_u16(), 200);
    let content_type = got.headers()["content-type"].to_str().unwrap().to_string();
    (got.body_mut().read_to_vec().unwrap(), content_type)
}

/// A Docker config file with `user:pass` for `registry`, in `dir`.
pub fn docker_config(dir: &Path, registry: &str, user: &str, pass: &str) -> PathBuf {
    use base64::Engine;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
    let path = dir.join("config.json");
    std::fs::write(
        &path,
        format!(r#"{{"auths":{{"{registry}":{{"auth":"{auth}"}}}}}}"#),
    )
    .unwrap();
    path
}
