//! The data path's debug events (`--log-datapath`: classifications, the AQM's marks and drops,
//! the ACK filter's decisions; `shaper_common::logs`) in the process's log.
//!
//! The data path writes them into aya-log's ring buffer; a thread of the data path's own waits
//! on it and hands each record to `tracing`, at INFO under the target `shaper::datapath`
//! (asking for the option is asking to see them; `SHAPER_LOG=info,shaper::datapath=off` hides
//! them again), with the interface the data path shapes. Without the option nothing reads the
//! ring buffer, and the data path never writes to it.

use std::{
    os::fd::{AsFd, AsRawFd},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use aya::Ebpf;
use aya_log::EbpfLogger;
use shaper_common::logs;

/// How long the forwarding thread waits for a record before it looks whether to stop: the
/// longest a dropped data path keeps its thread.
const WAIT: Duration = Duration::from_millis(200);

/// The forwarding thread of one data path; stopped (after a last read) when dropped.
pub struct Events {
    iface: Arc<Mutex<String>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Events {
    /// Starts forwarding the records of `ebpf`'s programs.
    pub fn forward(ebpf: &mut Ebpf) -> Result<Self, aya_log::Error> {
        let iface = Arc::new(Mutex::new(String::new()));
        let mut logger = EbpfLogger::init_with_logger(
            ebpf,
            ToTracing {
                iface: iface.clone(),
            },
        )?;
        tracing::info!(
            "logging the data path's decisions (--log-datapath): at most {} a second of each kind per CPU",
            logs::EVENTS_PER_SECOND
        );
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("datapath-events".into())
            .spawn(move || {
                while !stopping.load(Ordering::Relaxed) {
                    wait_readable(logger.as_fd().as_raw_fd(), WAIT);
                    logger.flush();
                }
                logger.flush();
            })
            .ok();
        Ok(Self {
            iface,
            stop,
            thread,
        })
    }

    /// Names the interface the data path shapes, in every record from now on.
    pub fn shaping(&self, iface: &str) {
        if let Ok(mut name) = self.iface.lock() {
            *name = iface.to_string();
        }
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Waits until `fd` is readable or `timeout` has passed.
fn wait_readable(fd: i32, timeout: Duration) {
    let mut pollfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd; the descriptor outlives the call (the logger holds it).
    unsafe { libc::poll(&mut pollfd, 1, timeout.as_millis() as libc::c_int) };
}

/// aya-log's records (through the `log` interface it writes to) as `tracing` events.
struct ToTracing {
    iface: Arc<Mutex<String>>,
}

impl log::Log for ToTracing {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let text = record.args().to_string();
        let iface = self.iface.lock().map(|n| n.clone()).unwrap_or_default();
        // The decision names are padded to a fixed length in the data path.
        tracing::info!(target: "shaper::datapath", iface = %iface, "{}", text.trim_end());
    }

    fn flush(&self) {}
}
