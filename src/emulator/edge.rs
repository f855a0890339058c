//! E2B's edge proxy: which sandbox and port a request is for, the proxy's own answers, and
//! the sandbox's user ports (`get_host(port)`), relayed to what a process of the sandbox
//! listens on there.
//!
//! A request names its sandbox and port by its host, `<port>-<sandboxID>.<domain>`, or, on
//! the emulator's own address (an IP literal or `localhost`, where the SDK's envd calls
//! arrive), by the routing headers `E2b-Sandbox-Id` and `E2b-Sandbox-Port`. Port 49983 is
//! envd; any other is the sandbox's own. A paused sandbox created with autoResume is woken
//! by such a request, as E2B wakes it.
//!
//! A relayed request is passed on as HTTP/1.1 with its body and `Connection: close`, and the
//! answer comes back as the sandbox's server sends it; the client's connection ends with it.
//! Protocol upgrades (WebSocket) are not relayed.

use std::io::Write;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::http::{Request, Responder, Response};
use super::state::{constant_time_eq, Asleep, SandboxEntry, Shared};
use crate::errors::error_chain;

/// envd's port in every sandbox.
pub(super) const ENVD_PORT: u16 = 49983;
/// How long connecting to a sandbox's port may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a sandbox's server (or a tunnel's client) may stay silent before the relay
/// gives up.
pub(super) const UPSTREAM_IDLE: Duration = Duration::from_secs(300);
/// Headers that belong to one hop, not passed on (RFC 9110 §7.6.1), and the proxy's own.
const NOT_PASSED_ON: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "e2b-traffic-access-token",
];

/// A sandbox and one of its ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Target {
    /// As the request names it (the legacy `<id>-<clientID>` included).
    pub raw_id: String,
    pub port: u16,
}

/// The sandbox and port `head` is for, if it names one.
pub(super) fn target(head: &Request) -> Option<Target> {
    if let Some(t) = from_host(head.header("host").unwrap_or("")) {
        return Some(t);
    }
    let raw_id = head.header("e2b-sandbox-id")?.to_string();
    let port = match head.header("e2b-sandbox-port") {
        None => ENVD_PORT,
        Some(p) => p.parse().ok()?,
    };
    Some(Target { raw_id, port })
}

/// `<port>-<sandboxID>.<domain>`, perhaps with `:<port of the proxy>` after it (a Host
/// header, a `CONNECT` target): the sandbox id is lowercase letters and digits.
pub(super) fn from_host(host: &str) -> Option<Target> {
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    let (label, domain) = name.split_once('.')?;
    let (port, id) = label.split_once('-')?;
    let id_ok = !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !id_ok || domain.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(Target {
        raw_id: id.to_string(),
        port: port.parse().ok()?,
    })
}

/// The entry of the sandbox `raw_id` names, woken when it is paused and was made to be woken
/// by traffic; else the proxy's answer.
pub(super) fn awake(shared: &Shared, raw_id: &str) -> Result<Arc<SandboxEntry>, Response> {
    let id = raw_id.split('-').next().unwrap_or(raw_id);
    shared.awake_sandbox(id).map_err(|asleep| match asleep {
        Asleep::NotWoken => sandbox_gone(raw_id),
        Asleep::AtLimit => {
            let max = shared.config.max_sandboxes;
            Response::error(
                429,
                format!("resuming the sandbox would pass the team sandbox limit ({max})"),
            )
        }
        Asleep::Failed(e) => Response::error(
            500,
            format!("cannot resume the sandbox: {}", error_chain(&e)),
        ),
    })
}

/// Relays `req` to the sandbox's port `target.port`.
pub(super) fn relay(shared: &Shared, target: &Target, req: Request, out: &mut Responder<'_>) {
    if let Err(resp) = relay_inner(shared, target, req, out) {
        if !out.sent() {
            let _ = out.send(resp);
        }
    }
}

fn relay_inner(
    shared: &Shared,
    target: &Target,
    req: Request,
    out: &mut Responder<'_>,
) -> Result<(), Response> {
    let mut upstream = open(shared, target, req.header("e2b-traffic-access-token"))?;
    upstream
        .write_all(&request_bytes(&req))
        .map_err(|_| port_not_open(target))?;
    match out.relay(&mut upstream) {
        Ok(0) => Err(port_not_open(target)),
        Ok(_) => Ok(()),
        // Cut mid-answer: the client sees the cut.
        Err(_) if out.sent() => Ok(()),
        Err(e) => Err(proxy_error(
            502,
            json!({"message": format!("the sandbox's server did not answer: {e}"),
                   "sandboxId": target.raw_id, "port": target.port}),
        )),
    }
}

/// A connection to `target`'s port for a request carrying `traffic_token`: the sandbox woken
/// if it may be, its traffic token checked, a process of it listening there; else the
/// proxy's answer.
pub(super) fn open(
    shared: &Shared,
    target: &Target,
    traffic_token: Option<&str>,
) -> Result<TcpStream, Response> {
    let entry = awake(shared, &target.raw_id)?;
    if let Some(token) = &entry.traffic_token {
        let given = traffic_token.unwrap_or("");
        if !constant_time_eq(given.as_bytes(), token.as_bytes()) {
            return Err(proxy_error(
                403,
                json!({"message": "a valid traffic access token is required \
                       (e2b-traffic-access-token) for this sandbox's ports",
                       "sandboxId": target.raw_id}),
            ));
        }
    }
    let upstream = entry
        .sandbox
        .connect_port(target.port, CONNECT_TIMEOUT)
        .map_err(|_| port_not_open(target))?
        .ok_or_else(|| port_not_open(target))?;
    let _ = upstream.set_read_timeout(Some(UPSTREAM_IDLE));
    let _ = upstream.set_write_timeout(Some(UPSTREAM_IDLE));
    Ok(upstream)
}

fn port_not_open(target: &Target) -> Response {
    proxy_error(
        502,
        json!({"message": "The sandbox is running but port is not open",
               "sandboxId": target.raw_id, "port": target.port}),
    )
}

/// `req` as passed on: its head without this hop's headers, then its whole body.
fn request_bytes(req: &Request) -> Vec<u8> {
    let mut head = format!("{} {} HTTP/1.1\r\n", req.method, req.target);
    for (name, value) in &req.headers {
        if !NOT_PASSED_ON.contains(&name.as_str()) {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    if !req.body.is_empty() || !matches!(req.method.as_str(), "GET" | "HEAD") {
        head.push_str(&format!("content-length: {}\r\n", req.body.len()));
    }
    head.push_str("connection: close\r\n\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(&req.body);
    bytes
}

/// What E2B's edge proxy answers for a sandbox that is gone (or paused, not to be woken).
fn sandbox_gone(raw_id: &str) -> Response {
    proxy_error(
        502,
        json!({"message": "The sandbox was not found", "sandboxId": raw_id}),
    )
}

/// The proxy's own answers: JSON with an integer `code`.
fn proxy_error(status: u16, mut body: serde_json::Value) -> Response {
    body["code"] = json!(status);
    Response::bytes(
        status,
        "application/json; charset=utf-8",
        body.to_string().into_bytes(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(headers: &[(&str, &str)]) -> Request {
        Request {
            method: "GET".into(),
            target: "/a%20b?x=1".into(),
            path: "/a b".into(),
            query: vec![("x".into(), "1".into())],
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: Vec::new(),
        }
    }

    fn at(raw_id: &str, port: u16) -> Option<Target> {
        Some(Target {
            raw_id: raw_id.into(),
            port,
        })
    }

    #[test]
    fn the_host_names_the_sandbox_and_port() {
        let t = |host| target(&head(&[("host", host)]));
        assert_eq!(t("8000-abc123.e2b.app"), at("abc123", 8000));
        assert_eq!(t("8000-abc123.localhost:3000"), at("abc123", 8000));
        assert_eq!(t("49983-abc123.e2b.app"), at("abc123", ENVD_PORT));
        // Not a sandbox's host: the emulator's own address, uppercase ids, no port.
        assert_eq!(t("127.0.0.1:3000"), None);
        assert_eq!(t("8000-ABC.e2b.app"), None);
        assert_eq!(t("x-abc.e2b.app"), None);
        assert_eq!(t("8000-abc"), None);
        assert_eq!(t("99999-abc.e2b.app"), None);
    }

    #[test]
    fn on_the_emulators_address_the_routing_headers_name_it() {
        let h = |port: Option<&str>| {
            let mut hs = vec![("host", "127.0.0.1:3000"), ("e2b-sandbox-id", "abc-client")];
            hs.extend(port.map(|p| ("e2b-sandbox-port", p)));
            target(&head(&hs))
        };
        assert_eq!(h(None), at("abc-client", ENVD_PORT));
        assert_eq!(h(Some("49983")), at("abc-client", ENVD_PORT));
        assert_eq!(h(Some("8000")), at("abc-client", 8000));
        assert_eq!(h(Some("eight")), None);
        assert_eq!(target(&head(&[("host", "127.0.0.1:3000")])), None);
    }

    #[test]
    fn a_relayed_request_keeps_its_target_and_drops_this_hops_headers() {
        let mut req = head(&[
            ("host", "8000-abc.e2b.app"),
            ("connection", "keep-alive"),
            ("e2b-traffic-access-token", "secret"),
            ("x-mine", "1"),
        ]);
        req.method = "POST".into();
        req.body = b"hello".to_vec();
        let text = String::from_utf8(request_bytes(&req)).unwrap();
        assert!(text.starts_with("POST /a%20b?x=1 HTTP/1.1\r\n"), "{text}");
        assert!(text.contains("host: 8000-abc.e2b.app\r\n"));
        assert!(text.contains("x-mine: 1\r\n"));
        assert!(text.contains("content-length: 5\r\n"));
        assert!(
            !text.contains("keep-alive") && !text.contains("secret"),
            "{text}"
        );
        assert!(text.ends_with("connection: close\r\n\r\nhello"), "{text}");
    }
}
