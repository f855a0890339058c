//! Reaching, from the host, a TCP port that a process of a sandbox listens on (what E2B's
//! edge proxy does for `<port>-<id>.<domain>`).
//!
//! A sandbox's processes are found by their PID namespaces (see `freeze`), and a listener
//! counts only when a process of the sandbox holds its socket: a port the host or another
//! sandbox listens on is never reached through this sandbox, even when they share the
//! host's network. The connection is made from inside the network namespace the listener
//! lives in (a sandbox's own, or a command's own when it has no internet), by a thread that
//! joins that namespace for the one `connect`: a socket stays in the namespace it was made
//! in, so the stream works from any thread afterwards. Joining another namespace takes
//! privileges over it, which the host's root has.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use super::freeze::{self, Namespaces};
use super::holder_start::namespace_inode;
use super::{ns, sys};

/// `/proc/<pid>/net/tcp` lists every socket of a namespace: a line is ~150 bytes.
const MAX_TABLE_BYTES: u64 = 16 << 20;
/// The most descriptors looked at per process.
const MAX_FDS: usize = 1 << 16;
/// `st` of a listening socket in `/proc/net/tcp`.
const LISTEN: &str = "0A";

/// A socket listening on the port asked for, in some network namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Listener {
    inode: u64,
    addr: IpAddr,
}

/// A stream to `port` on the sandbox in `dir`, connected where the sandbox's process that
/// listens on it lives; `None` when no process of the sandbox listens there.
pub(super) fn connect(dir: &Path, port: u16, timeout: Duration) -> io::Result<Option<TcpStream>> {
    let spaces = Namespaces::of(&ns::recorded(dir));
    let mut by_netns: HashMap<u64, Vec<(u32, u64)>> = HashMap::new();
    for (pid, start) in freeze::member_ids(&spaces) {
        if let Some(netns) = namespace_inode(pid, "net") {
            by_netns.entry(netns).or_default().push((pid, start));
        }
    }
    for (netns, members) in &by_netns {
        let Some(&(pid, start)) = members.first() else {
            continue;
        };
        let listeners = listening(pid, port);
        if listeners.is_empty() {
            continue;
        }
        let held = held_sockets(members);
        let Some(listener) = listeners.iter().find(|l| held.contains(&l.inode)) else {
            continue;
        };
        let target = SocketAddr::new(reachable(listener.addr), port);
        return connect_in(*netns, pid, start, target, timeout).map(Some);
    }
    Ok(None)
}

/// Where a listener bound to `addr` is reached from inside its namespace.
fn reachable(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V4(a) if a.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(a) if a.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        a => a,
    }
}

/// Connects to `target` from the network namespace `netns`, which `pid` (started at
/// `start`) lives in.
fn connect_in(
    netns: u64,
    pid: u32,
    start: u64,
    target: SocketAddr,
    timeout: Duration,
) -> io::Result<TcpStream> {
    if namespace_inode(std::process::id(), "net") == Some(netns) {
        return TcpStream::connect_timeout(&target, timeout);
    }
    let ns = File::open(format!("/proc/{pid}/ns/net"))?;
    // The pid named a process of the sandbox when it was listed; make sure it still does, so
    // a pid reused meanwhile never lends us someone else's network.
    if !sys::is_alive(pid, start) || namespace_inode(pid, "net") != Some(netns) {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "the listening process ended",
        ));
    }
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // SAFETY: setns on a namespace fd we own; it changes this thread alone, which
                // ends when the closure returns.
                if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                TcpStream::connect_timeout(&target, timeout)
            })
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the connecting thread panicked")))
    })
}

/// The sockets listening on `port` in the network namespace of `pid`.
fn listening(pid: u32, port: u16) -> Vec<Listener> {
    let mut out = Vec::new();
    for table in ["tcp", "tcp6"] {
        let mut text = String::new();
        let read = File::open(format!("/proc/{pid}/net/{table}"))
            .and_then(|f| f.take(MAX_TABLE_BYTES).read_to_string(&mut text));
        if read.is_ok() {
            out.extend(parse_table(&text, port));
        }
    }
    out
}

/// The listeners on `port` in one `/proc/net/tcp` or `tcp6` table.
fn parse_table(text: &str, port: u16) -> Vec<Listener> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (local, state, inode) = (fields.get(1)?, fields.get(3)?, fields.get(9)?);
            let (addr, local_port) = local.split_once(':')?;
            if *state != LISTEN || u16::from_str_radix(local_port, 16).ok()? != port {
                return None;
            }
            Some(Listener {
                inode: inode.parse().ok()?,
                addr: parse_addr(addr)?,
            })
        })
        .collect()
}

/// An address as the kernel prints it: 32-bit words in hex, each in host byte order.
fn parse_addr(hex: &str) -> Option<IpAddr> {
    let words: Vec<u32> = (0..hex.len() / 8)
        .map(|i| u32::from_str_radix(hex.get(i * 8..i * 8 + 8)?, 16).ok())
        .collect::<Option<_>>()?;
    let bytes: Vec<u8> = words
        .iter()
        .flat_map(|w| w.swap_bytes().to_be_bytes())
        .collect();
    match bytes.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::new(
            bytes[0], bytes[1], bytes[2], bytes[3],
        ))),
        16 => {
            let octets: [u8; 16] = bytes.try_into().ok()?;
            let v6 = Ipv6Addr::from(octets);
            // A v4 listener seen through a v6 socket (`::ffff:a.b.c.d`) is reached as v4.
            Some(v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4))
        }
        _ => None,
    }
}

/// The inodes of the sockets `members` hold open.
fn held_sockets(members: &[(u32, u64)]) -> Vec<u64> {
    let mut out = Vec::new();
    for &(pid, _) in members {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.take(MAX_FDS).flatten() {
            let Ok(link) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let inode = link
                .to_str()
                .and_then(|l| l.strip_prefix("socket:["))
                .and_then(|l| l.strip_suffix(']'))
                .and_then(|n| n.parse::<u64>().ok());
            out.extend(inode);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F41 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4343 1 0000000000000000 100 0 0 10 0
   2: 0100007F:1F40 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  1000        0 4444 1 0000000000000000 20 4 30 10 -1
";

    #[test]
    fn listeners_on_the_port_are_read_from_the_kernels_table() {
        let on_8000 = parse_table(TCP, 8000);
        assert_eq!(
            on_8000,
            vec![Listener {
                inode: 4242,
                addr: IpAddr::V4(Ipv4Addr::UNSPECIFIED)
            }]
        );
        let on_8001 = parse_table(TCP, 8001);
        assert_eq!(on_8001[0].addr, IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert!(parse_table(TCP, 9000).is_empty());
    }

    #[test]
    fn v6_addresses_are_read_word_by_word() {
        let loopback = "00000000000000000000000001000000";
        assert_eq!(parse_addr(loopback), Some(IpAddr::V6(Ipv6Addr::LOCALHOST)));
        let mapped = "0000000000000000FFFF00000100007F";
        assert_eq!(parse_addr(mapped), Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        assert_eq!(parse_addr("zz"), None);
    }

    #[test]
    fn a_listener_of_this_process_is_found_and_one_it_does_not_hold_is_not() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let found = listening(std::process::id(), port);
        assert_eq!(found.len(), 1);
        let me = [(std::process::id(), 0)];
        assert!(held_sockets(&me).contains(&found[0].inode));
        assert_eq!(reachable(found[0].addr), IpAddr::V4(Ipv4Addr::LOCALHOST));
        drop(listener);
        assert!(listening(std::process::id(), port).is_empty());
    }
}
