//! How busy the host was with other work while each run ran. The VM is emulated, so a host
//! busy with something else (a build, another VM) slows the VM's network and shows in its
//! numbers; this makes that visible per run instead of guessing.
//!
//! A thread samples the host's /proc/stat and the qemu child's CPU time once a second; a run's
//! share is (host busy − qemu) / host capacity over the run's window. The VM's clock starts
//! from the host's RTC, so the runner's timestamps line up with these to well under a second.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// Unix time, seconds.
    t: f64,
    /// Host CPU time in jiffies: all, and busy (not idle or iowait), over every CPU.
    total: u64,
    busy: u64,
    /// CPU time of our qemu child(ren), jiffies.
    qemu: u64,
}

pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Vec<Sample>>,
}

pub fn start() -> Sampler {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let handle = std::thread::spawn(move || {
        let mut samples = Vec::new();
        while !flag.load(Ordering::Relaxed) {
            if let Some(s) = sample() {
                samples.push(s);
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        samples
    });
    Sampler { stop, handle }
}

impl Sampler {
    pub fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

fn sample() -> Option<Sample> {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .ok()?
        .as_secs_f64();
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .take(8)
        .filter_map(|w| w.parse().ok())
        .collect();
    if cpu.len() < 8 {
        return None;
    }
    let total: u64 = cpu.iter().sum();
    let busy = total - cpu[3] - cpu[4];
    Some(Sample {
        t,
        total,
        busy,
        qemu: qemu_jiffies(),
    })
}

/// utime + stime of this process's children named qemu*.
fn qemu_jiffies() -> u64 {
    let me = std::process::id().to_string();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut sum = 0;
    for e in dir.flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ... utime(14) stime(15); comm may hold spaces, so split after ')'.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        if !head.contains("(qemu") {
            continue;
        }
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.get(1) == Some(&me.as_str()) {
            let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            sum += n(11) + n(12);
        }
    }
    sum
}

/// The share of the host's CPU capacity used by anything but the VM during [from, to] (Unix
/// seconds); None without two samples spanning part of it.
pub fn others_share(samples: &[Sample], from: f64, to: f64) -> Option<f64> {
    let first = samples
        .iter()
        .rev()
        .find(|s| s.t <= from)
        .or(samples.first())?;
    let last = samples.iter().find(|s| s.t >= to).or(samples.last())?;
    let total = last.total.checked_sub(first.total)?;
    if total == 0 {
        return None;
    }
    let busy = last.busy.saturating_sub(first.busy);
    let qemu = last.qemu.saturating_sub(first.qemu);
    Some(busy.saturating_sub(qemu) as f64 / total as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn share_of_others() {
        let s = |t, total, busy, qemu| Sample {
            t,
            total,
            busy,
            qemu,
        };
        // 2 CPUs, 200 jiffies a second; qemu uses 100 of them, others 50.
        let samples = [
            s(0.0, 0, 0, 0),
            s(1.0, 200, 150, 100),
            s(2.0, 400, 300, 200),
        ];
        assert_eq!(others_share(&samples, 0.0, 2.0), Some(0.25));
        assert_eq!(others_share(&samples, 0.5, 1.5), Some(0.25));
        assert_eq!(others_share(&[], 0.0, 1.0), None);
    }
}
