//! What one sandbox may take of its host: memory, processes, CPU and disk, and which of them
//! a task ran into.
//!
//! The local backend enforces them (cgroups and a disk watcher, see `local::cgroup`); E2B
//! ignores them, since the template's resources are its limits.

use serde::Deserialize;

/// Memory a sandbox may use by default (its processes, and the tmpfs pages they write).
pub const DEFAULT_MEMORY_MB: u64 = 4096;
/// Processes (threads included) a sandbox may run at once by default.
pub const DEFAULT_PIDS: u64 = 1024;
/// CPUs' worth of time a sandbox may use by default.
pub const DEFAULT_CPUS: f64 = 2.0;
/// What a sandbox's writable directories (home and /tmp) may hold by default.
pub const DEFAULT_DISK_MB: u64 = 4096;

/// The largest value any limit accepts: beyond it a limit would bound nothing, and the
/// arithmetic on it (MiB to bytes, CPUs to microseconds) stays far from overflow.
const MAX_MB: u64 = 1 << 30;
const MAX_PIDS: u64 = 1 << 22;
const MAX_CPUS: f64 = 4096.0;

/// Limits for one sandbox; `None` leaves that resource unbounded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    #[serde(default)]
    pub memory_mb: Option<u64>,
    #[serde(default)]
    pub pids: Option<u64>,
    #[serde(default)]
    pub cpus: Option<f64>,
    #[serde(default)]
    pub disk_mb: Option<u64>,
}

impl Limits {
    /// The defaults that keep one task from taking the host.
    pub fn defaults() -> Limits {
        Limits {
            memory_mb: Some(DEFAULT_MEMORY_MB),
            pids: Some(DEFAULT_PIDS),
            cpus: Some(DEFAULT_CPUS),
            disk_mb: Some(DEFAULT_DISK_MB),
        }
    }

    /// Whether any resource is bounded.
    pub fn any(&self) -> bool {
        self.memory_mb.is_some()
            || self.pids.is_some()
            || self.cpus.is_some()
            || self.disk_mb.is_some()
    }

    /// Ours, narrowed by `task`'s where it sets a smaller one: a task may ask for less than
    /// the run gives, never more (tasks are not trusted with the host).
    pub fn narrowed_by(&self, task: Option<&Limits>) -> Limits {
        let Some(task) = task else { return *self };
        fn least<T: PartialOrd + Copy>(run: Option<T>, task: Option<T>) -> Option<T> {
            match (run, task) {
                (Some(r), Some(t)) => Some(if t < r { t } else { r }),
                (r, t) => r.or(t),
            }
        }
        Limits {
            memory_mb: least(self.memory_mb, task.memory_mb),
            pids: least(self.pids, task.pids),
            cpus: least(self.cpus, task.cpus),
            disk_mb: least(self.disk_mb, task.disk_mb),
        }
    }

    /// Why these limits cannot be applied: the field at fault, and why.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        let whole = |name: &'static str, v: Option<u64>, min: u64, max: u64| match v {
            Some(v) if !(min..=max).contains(&v) => {
                Err((name, format!("{v} must be in [{min}, {max}]")))
            }
            _ => Ok(()),
        };
        // Below these a sandbox cannot start its runner at all.
        whole("memory_mb", self.memory_mb, 16, MAX_MB)?;
        whole("pids", self.pids, 8, MAX_PIDS)?;
        whole("disk_mb", self.disk_mb, 1, MAX_MB)?;
        match self.cpus {
            Some(c) if !(c.is_finite() && (0.01..=MAX_CPUS).contains(&c)) => {
                Err(("cpus", format!("{c} must be in [0.01, {MAX_CPUS}]")))
            }
            _ => Ok(()),
        }
    }
}

/// The limit a sandbox ran into: the task's stop reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitHit {
    /// A process was killed for want of memory.
    Memory,
    /// A process could not start: the sandbox ran as many as it may.
    Pids,
    /// Its writable directories held more than they may.
    Disk,
}

impl LimitHit {
    /// The stop reason a result names.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitHit::Memory => "oom",
            LimitHit::Pids => "pids",
            LimitHit::Disk => "disk",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_out_of_range_is_named() {
        assert!(Limits::defaults().check().is_ok());
        let bad = Limits {
            pids: Some(0),
            ..Limits::default()
        };
        assert_eq!(bad.check().unwrap_err().0, "pids");
        let bad = Limits {
            cpus: Some(f64::NAN),
            ..Limits::default()
        };
        assert_eq!(bad.check().unwrap_err().0, "cpus");
        let bad = Limits {
            memory_mb: Some(u64::MAX),
            ..Limits::default()
        };
        assert_eq!(bad.check().unwrap_err().0, "memory_mb");
    }

    #[test]
    fn a_task_narrows_the_run_never_widens_it() {
        let task = Limits {
            pids: Some(64),
            memory_mb: Some(DEFAULT_MEMORY_MB * 4),
            ..Limits::default()
        };
        let merged = Limits::defaults().narrowed_by(Some(&task));
        assert_eq!(merged.pids, Some(64));
        assert_eq!(merged.memory_mb, Some(DEFAULT_MEMORY_MB));
        let unbounded = Limits::default().narrowed_by(Some(&task));
        assert_eq!(unbounded.memory_mb, Some(DEFAULT_MEMORY_MB * 4));
    }
}
