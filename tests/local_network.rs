//! Network modes of local sandboxes, attacked from inside: with `internet` a sandbox has a
//! network of its own that reaches neither the host's loopback, nor the host's abstract
//! sockets, nor another sandbox, and lists none of the host's sockets; with `none` it has
//! loopback alone. No traffic leaves this machine: every target is a loopback address, an
//! abstract socket or a namespace these tests made.

use std::net::TcpListener;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};

mod support;

use std::time::Duration;

use support::local::{backend, sh, spec};
use support::{pid_alive, proc_pids, wait_for};
use wmo_e2b::sandbox::{CreateSpec, Network, Sandbox, SpawnOpts};

/// A sandbox with a network of its own, or `None` (and why, printed) where this host
/// cannot give one.
fn internet_sandbox(
    b: &wmo_e2b::sandbox::local::LocalBackend,
) -> Option<std::sync::Arc<dyn Sandbox>> {
    if let Some(why) = b.network_unavailable() {
        eprintln!("skipped: {why}");
        return None;
    }
    Some(
        wmo_e2b::sandbox::Backend::create(
            b,
            &CreateSpec {
                network: Network::Internet,
                ..spec()
            },
        )
        .unwrap(),
    )
}

/// A shell line that exits 0 when a TCP connection to `addr` `port` is made.
fn tcp_connect(addr: &str, port: u16) -> String {
    format!("timeout 5 bash -c 'echo > /dev/tcp/{addr}/{port}' 2>/dev/null && echo CONNECTED || echo refused")
}

/// A shell line that says CONNECTED when the abstract unix socket `name` takes a connection.
fn abstract_connect(name: &str) -> String {
    format!(
        "perl -MSocket -e 'socket(S, PF_UNIX, SOCK_STREAM, 0) or die; \
         print connect(S, pack_sockaddr_un(\"\\0{name}\")) ? \"CONNECTED\" : \"refused: $!\"'"
    )
}

#[test]
fn internet_reaches_nothing_of_the_host_but_has_a_default_route() {
    let (state, b) = backend();
    let Some(sb) = internet_sandbox(&b) else {
        return;
    };
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    // The host's loopback, directly and through the user-mode stack's gateway.
    for addr in ["127.0.0.1", "10.0.2.2"] {
        let out = sh(&*sb, &tcp_connect(addr, port)).stdout.to_text();
        assert_eq!(
            out.trim(),
            "refused",
            "{addr}:{port} reached from the sandbox"
        );
    }
    let name = format!("wmo-e2b-test-{}", std::process::id());
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let _unix = UnixListener::bind_addr(&addr).unwrap();
    // The same attacks succeed from a sandbox on the host's network: they are real ones.
    let host = wmo_e2b::sandbox::Backend::create(&*b, &spec()).unwrap();
    let out = sh(&*host, &tcp_connect("127.0.0.1", port)).stdout.to_text();
    assert_eq!(
        out.trim(),
        "CONNECTED",
        "the host network's sandbox missed the server"
    );
    let out = sh(&*host, &abstract_connect(&name)).stdout.to_text();
    assert_eq!(
        out, "CONNECTED",
        "the host network's sandbox missed the socket"
    );
    let out = sh(&*sb, &abstract_connect(&name));
    assert!(
        out.stdout.to_text().starts_with("refused"),
        "the host's abstract socket answered: {} {}",
        out.stdout.to_text(),
        out.stderr.to_text()
    );
    // The host's listening socket is not among the sandbox's.
    let tcp = sh(&*sb, "cat /proc/net/tcp /proc/net/tcp6")
        .stdout
        .to_text();
    let needle = format!(":{port:04X} ");
    assert!(!tcp.contains(&needle), "host socket listed: {tcp}");
    // Outbound: an interface besides loopback, with the default route (nothing is sent).
    let route = sh(&*sb, "cat /proc/net/route").stdout.to_text();
    let default = route
        .lines()
        .skip(1)
        .find(|l| l.split_whitespace().nth(1) == Some("00000000"));
    let iface = default.and_then(|l| l.split_whitespace().next());
    assert!(
        iface.is_some_and(|i| i != "lo"),
        "no default route off loopback: {route}"
    );
    // Killing the sandbox ends its network stack too.
    let stack = network_stack_of(state.path(), sb.id());
    assert!(!stack.is_empty(), "no slirp4netns for {}", sb.id());
    wmo_e2b::sandbox::Backend::kill(&*b, sb.id()).unwrap();
    wait_for("the network stack to end", Duration::from_secs(10), || {
        stack.iter().all(|&p| !pid_alive(p))
    });
}

/// The live slirp4netns processes of sandbox `id`: attached to its holder's PID 1 by pid.
fn network_stack_of(state: &std::path::Path, id: &str) -> Vec<u32> {
    let record = state
        .join("sandboxes")
        .join(id)
        .join("ns")
        .join("sandbox.json");
    let Some(init) = std::fs::read(record)
        .ok()
        .and_then(|r| serde_json::from_slice::<serde_json::Value>(&r).ok())
        .and_then(|v| v["init"].as_u64())
    else {
        return Vec::new();
    };
    proc_pids()
        .into_iter()
        .filter(|p| {
            let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            let mut args = cmdline.split(|&b| b == 0);
            let slirp = args.next().is_some_and(|a| a.ends_with(b"slirp4netns"));
            slirp && args.any(|a| a == init.to_string().as_bytes()) && pid_alive(*p)
        })
        .collect()
}

#[test]
fn two_internet_sandboxes_cannot_reach_each_other() {
    let (_d, b) = backend();
    let (Some(a), Some(other)) = (internet_sandbox(&b), internet_sandbox(&b)) else {
        return;
    };
    // A listens on every address it has, TCP and an abstract socket, for a minute.
    let name = format!("wmo-e2b-peer-{}", std::process::id());
    let serve = format!(
        "perl -MIO::Socket::INET -MSocket -e '\
         my $t = IO::Socket::INET->new(LocalAddr => \"0.0.0.0:18099\", Listen => 5, ReuseAddr => 1) or die \"tcp: $!\"; \
         socket(U, PF_UNIX, SOCK_STREAM, 0) or die; bind(U, pack_sockaddr_un(\"\\0{name}\")) or die \"unix: $!\"; listen(U, 5); \
         sleep 60'"
    );
    let _server = a.spawn(&serve, &SpawnOpts::default()).unwrap();
    let listening = sh(
        &*a,
        "for i in $(seq 100); do grep -q ':46B3 ' /proc/net/tcp && break; sleep 0.1; done; grep -c ':46B3 ' /proc/net/tcp",
    )
    .stdout
    .to_text();
    assert_eq!(listening.trim(), "1", "A's server did not start");
    // A reaches its own server: the attack below is a real one.
    assert_eq!(
        sh(&*a, &tcp_connect("127.0.0.1", 18099))
            .stdout
            .to_text()
            .trim(),
        "CONNECTED"
    );
    assert_eq!(
        sh(&*a, &abstract_connect(&name)).stdout.to_text(),
        "CONNECTED"
    );
    // From the other sandbox, every address A has, and the host's side of the stack.
    let a_addrs = sh(
        &*a,
        "hostname -I 2>/dev/null; awk '$4 == \"01\" {print}' /proc/net/tcp >/dev/null",
    )
    .stdout
    .to_text();
    let mut targets: Vec<String> = a_addrs.split_whitespace().map(str::to_string).collect();
    targets.extend([
        "127.0.0.1".to_string(),
        "10.0.2.2".to_string(),
        "10.0.2.100".to_string(),
    ]);
    for addr in &targets {
        let out = sh(&*other, &tcp_connect(addr, 18099)).stdout.to_text();
        assert_eq!(
            out.trim(),
            "refused",
            "{addr}:18099 of the other sandbox reached"
        );
    }
    let out = sh(&*other, &abstract_connect(&name)).stdout.to_text();
    assert!(
        out.starts_with("refused"),
        "the other sandbox's abstract socket answered: {out}"
    );
}

#[test]
fn none_has_loopback_alone() {
    let (_d, b) = backend();
    let sb = wmo_e2b::sandbox::Backend::create(
        &*b,
        &CreateSpec {
            internet: false,
            ..spec()
        },
    )
    .unwrap();
    let dev = sh(&*sb, "tail -n +3 /proc/net/dev").stdout.to_text();
    let ifaces: Vec<&str> = dev
        .lines()
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .collect();
    assert_eq!(ifaces, ["lo"], "{dev}");
}
