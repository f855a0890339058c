//! The program that builds images: the first of `buildah`, `podman` and `docker` on `PATH`.
//! buildah (and podman, which takes the same flags for what is asked of it here) runs
//! daemonless, with its storage of its own under the image store, the vfs driver (no
//! overlay mounts needed) and chroot isolation; docker is found but not driven yet.
//!
//! Registries are reached as pulls reach them: the builder gets a `registries.conf` made
//! from `registries.toml` (mirrors, registries named insecure) plus every loopback registry
//! a `FROM` names, marked insecure, so no other registry is ever reached over plain HTTP.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::build::BuildError;
use super::reference::Reference;
use super::settings::{is_loopback, RegistryConfig};

/// Looked for on `PATH` in this order.
pub const BUILDERS: [&str; 3] = ["buildah", "podman", "docker"];

/// A builder wmo-e2b can drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuilderKind {
    Buildah,
    Podman,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Builder {
    pub kind: BuilderKind,
    pub program: PathBuf,
}

impl Builder {
    /// The first builder on `PATH`.
    pub fn find() -> Result<Builder, BuildError> {
        Builder::find_in(&std::env::var_os("PATH").unwrap_or_default())
    }

    /// The first builder in the directories of `path` (a `PATH` value).
    pub fn find_in(path: &OsStr) -> Result<Builder, BuildError> {
        for name in BUILDERS {
            let Some(program) = std::env::split_paths(path)
                .map(|dir| dir.join(name))
                .find(|p| is_executable(p))
            else {
                continue;
            };
            return match name {
                "buildah" => Ok(Builder {
                    kind: BuilderKind::Buildah,
                    program,
                }),
                "podman" => Ok(Builder {
                    kind: BuilderKind::Podman,
                    program,
                }),
                _ => Err(BuildError::DockerUnsupported { program }),
            };
        }
        Err(BuildError::NoBuilder)
    }

    pub fn name(&self) -> &'static str {
        match self.kind {
            BuilderKind::Buildah => "buildah",
            BuilderKind::Podman => "podman",
        }
    }

    /// The program with its storage under `storage` and the registries of `registries_conf`.
    pub(super) fn command(&self, storage: &Path, registries_conf: &Path) -> Command {
        let mut c = Command::new(&self.program);
        c.arg("--root")
            .arg(storage.join("root"))
            .arg("--runroot")
            .arg(storage.join("run"))
            .args(["--storage-driver", "vfs"]);
        if self.kind == BuilderKind::Podman {
            // No systemd to ask for cgroups or to log events to on a plain host.
            c.args(["--cgroup-manager", "cgroupfs", "--events-backend", "none"]);
        }
        c.env("CONTAINERS_REGISTRIES_CONF", registries_conf)
            // Layers are staged in TMPDIR: beside the storage, not on a small /tmp.
            .env("TMPDIR", storage.join("tmp"));
        if let Some(auth) = super::auth::CredentialStore::default_path().filter(|p| p.is_file()) {
            // The Docker config pulls use; buildah and podman read its `auths` as their own.
            c.env("REGISTRY_AUTH_FILE", auth);
        }
        c
    }

    /// `build` of `dockerfile` in `context`, tagged `name`, no layer cache (the key is the
    /// cache), processes run chrooted.
    pub(super) fn build_args(
        &self,
        dockerfile: &Path,
        context: &Path,
        name: &str,
        args: &[(String, String)],
    ) -> Vec<std::ffi::OsString> {
        let mut v: Vec<std::ffi::OsString> =
            ["build", "--isolation", "chroot", "--layers=false", "-f"]
                .map(Into::into)
                .to_vec();
        v.push(dockerfile.into());
        v.extend(["-t".into(), name.into()]);
        for (k, val) in args {
            v.push("--build-arg".into());
            v.push(format!("{k}={val}").into());
        }
        v.push(context.into());
        v
    }
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The registries (`host[:port]`) the `FROM` lines of `dockerfile` name, their global
/// `ARG`s substituted from `args` or their defaults. A `FROM` that does not parse is left
/// to the builder to refuse.
pub(super) fn from_registries(dockerfile: &str, args: &[(String, String)]) -> BTreeSet<String> {
    let mut globals: Vec<(String, String)> = Vec::new();
    let mut seen_from = false;
    let mut registries = BTreeSet::new();
    for line in logical_lines(dockerfile) {
        let mut words = line.split_whitespace();
        let Some(instruction) = words.next() else {
            continue;
        };
        if instruction.eq_ignore_ascii_case("ARG") && !seen_from {
            for decl in words {
                let (name, default) = decl.split_once('=').unwrap_or((decl, ""));
                let value = args
                    .iter()
                    .find(|(k, _)| k == name)
                    .map_or(default.trim_matches('"'), |(_, v)| v.as_str());
                globals.push((name.to_string(), value.to_string()));
            }
        } else if instruction.eq_ignore_ascii_case("FROM") {
            seen_from = true;
            let Some(image) = words.find(|w| !w.starts_with("--")) else {
                continue;
            };
            let image = substitute(image, &globals);
            if let Ok(r) = Reference::parse(&image) {
                registries.insert(r.registry);
            }
        }
    }
    registries
}

/// The Dockerfile's instructions, continuation lines joined and comments dropped.
pub(super) fn logical_lines(text: &str) -> Vec<String> {
    let escape = text
        .lines()
        .take_while(|l| l.trim_start().starts_with('#'))
        .find_map(|l| {
            let d = l.trim_start_matches('#').trim();
            let (k, v) = d.split_once('=')?;
            (k.trim().eq_ignore_ascii_case("escape") && v.trim() == "`").then_some('`')
        })
        .unwrap_or('\\');
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') {
            continue;
        }
        match trimmed.strip_suffix(escape) {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                out.push(std::mem::take(&mut current));
            }
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// `$NAME`, `${NAME}` and `${NAME:-default}` of `vars` in `word`; unknown names are empty,
/// as the builders make them.
pub(super) fn substitute(word: &str, vars: &[(String, String)]) -> String {
    let lookup = |name: &str| {
        vars.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let mut out = String::new();
    let mut rest = word;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(braced) = after.strip_prefix('{') {
            let Some(end) = braced.find('}') else {
                out.push_str(&rest[at..]);
                return out;
            };
            let inner = &braced[..end];
            let (name, default) = match inner.split_once(":-") {
                Some((n, d)) => (n, Some(d)),
                None => (inner, None),
            };
            let value = lookup(name).filter(|v| !v.is_empty());
            out.push_str(&value.or(default.map(str::to_string)).unwrap_or_default());
            rest = &braced[end + 1..];
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            out.push_str(&lookup(&after[..end]).unwrap_or_default());
            rest = &after[end..];
        }
    }
    out.push_str(rest);
    out
}

/// A `registries.conf` (v2) for the builder: Docker Hub for short names, every registry of
/// `config` with its mirrors, and the loopback registries of `from` (insecure, as pulls
/// treat them).
pub(super) fn registries_conf(config: &RegistryConfig, from: &BTreeSet<String>) -> String {
    let quote = |s: &str| serde_json::Value::String(s.to_string()).to_string();
    let mut text = String::from(
        "# Written by wmo-e2b for one build: registries.toml and the loopback registries the\n\
         # Dockerfile names.\n\
         unqualified-search-registries = [\"docker.io\"]\n\
         short-name-mode = \"permissive\"\n",
    );
    let mut hosts: BTreeSet<&str> = config.registries().map(|(h, _)| h).collect();
    hosts.extend(from.iter().map(String::as_str).filter(|h| is_loopback(h)));
    for host in hosts {
        text.push_str(&format!(
            "\n[[registry]]\nlocation = {}\ninsecure = {}\n",
            quote(host),
            config.plain_http_allowed(host)
        ));
        for mirror in config.mirrors(host) {
            text.push_str(&format!(
                "[[registry.mirror]]\nlocation = {}\ninsecure = {}\n",
                quote(mirror),
                config.plain_http_allowed(mirror)
            ));
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::settings::RegistrySettings;

    #[test]
    fn from_lines_name_their_registries_with_global_args_substituted() {
        let dockerfile = "# escape=\\\n\
            ARG BASE=busybox:1\n\
            ARG PORT\n\
            FROM --platform=linux/amd64 ${BASE} AS one\n\
            FROM 127.0.0.1:$PORT/x/y:2 \\\n  AS two\n\
            # FROM ignored.io/z\n\
            from ${MISSING:-localhost:5000/d}\n\
            FROM one\n";
        let args = [("PORT".to_string(), "5001".to_string())];
        let got: Vec<String> = from_registries(dockerfile, &args).into_iter().collect();
        assert_eq!(got, ["127.0.0.1:5001", "docker.io", "localhost:5000"]);
        let args = [("BASE".to_string(), "[::1]:7/b".to_string())];
        assert!(from_registries(dockerfile, &args).contains("[::1]:7"));
    }

    #[test]
    fn only_loopback_and_named_insecure_registries_are_insecure_to_the_builder() {
        let config = RegistryConfig::default()
            .with(
                "docker.io",
                RegistrySettings {
                    mirrors: vec!["m.internal:5000".into()],
                    insecure: false,
                },
            )
            .with(
                "m.internal:5000",
                RegistrySettings {
                    mirrors: vec![],
                    insecure: true,
                },
            );
        let from: BTreeSet<String> = ["127.0.0.1:5001", "quay.io"].map(String::from).into();
        let conf = registries_conf(&config, &from);
        assert!(conf.contains(
            "location = \"docker.io\"\ninsecure = false\n[[registry.mirror]]\n\
             location = \"m.internal:5000\"\ninsecure = true\n"
        ));
        assert!(conf.contains("location = \"127.0.0.1:5001\"\ninsecure = true\n"));
        assert!(!conf.contains("quay.io"), "{conf}");
        assert!(toml::from_str::<toml::Table>(&conf).is_ok(), "{conf}");
    }

    #[test]
    fn the_first_builder_on_path_wins_and_docker_alone_is_named_unsupported() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = |name: &str, tools: &[&str]| {
            let d = tmp.path().join(name);
            std::fs::create_dir_all(&d).unwrap();
            for t in tools {
                std::fs::write(d.join(t), "#!/bin/sh\n").unwrap();
                std::fs::set_permissions(d.join(t), std::fs::Permissions::from_mode(0o755))
                    .unwrap();
            }
            d
        };
        let path = |dirs: &[PathBuf]| std::env::join_paths(dirs).unwrap();
        let docker = dir("a", &["docker"]);
        let podman = dir("b", &["podman"]);
        let both = dir("c", &["buildah", "podman"]);
        let b = Builder::find_in(&path(&[docker.clone(), podman.clone(), both.clone()])).unwrap();
        assert_eq!(
            (b.kind, b.program),
            (BuilderKind::Buildah, both.join("buildah"))
        );
        let b = Builder::find_in(&path(&[docker.clone(), podman])).unwrap();
        assert_eq!(b.kind, BuilderKind::Podman);
        assert!(matches!(
            Builder::find_in(&path(&[docker])),
            Err(BuildError::DockerUnsupported { .. })
        ));
        let none = Builder::find_in(&path(&[dir("d", &[])])).unwrap_err();
        assert!(
            none.to_string().contains("apt-get install buildah"),
            "{none}"
        );
    }
}
