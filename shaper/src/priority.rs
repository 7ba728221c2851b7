//! The control loop's place on a busy CPU. Each tick rewrites the hosts' levels from what they
//! sent over the interval before; a tick that waits for a CPU behind ordinary processes or a
//! flood's softirq work leaves older levels in force for as long. The control loop's thread
//! therefore runs ahead of ordinary processes (`CONTROL_NICE`), as a time daemon's does. Its
//! tick is bounded (the hosts map's size), so this takes little from them. A priority already
//! higher, given by the service manager, is kept; without the right to raise it (no
//! CAP_SYS_NICE), the thread stays where it is and says so.

use std::io;

/// The control thread's nice value: ahead of ordinary processes (0), behind the kernel's
/// real-time work.
pub const CONTROL_NICE: i32 = -10;

/// The nice value to take, given the one in force: the higher priority of the two.
pub fn wanted_nice(current: i32) -> i32 {
    current.min(CONTROL_NICE)
}

/// Raises the calling thread (only it: Linux keeps a nice value per thread) to
/// `wanted_nice`. Returns the nice value in force afterwards.
pub fn raise_this_thread() -> io::Result<i32> {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() } as libc::id_t;
    let current = nice_of(tid)?;
    let wanted = wanted_nice(current);
    if wanted == current {
        return Ok(current);
    }
    // SAFETY: plain syscall on this thread's id.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, wanted) } != 0 {
        return Err(io::Error::last_os_error());
    }
    nice_of(tid)
}

fn nice_of(tid: libc::id_t) -> io::Result<i32> {
    // getpriority returns the nice value, and -1 is a valid one: errno tells an error apart.
    // SAFETY: errno is thread-local; clearing it before the call is how getpriority is used.
    unsafe {
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS, tid);
        if nice == -1 && *libc::__errno_location() != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(nice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_priority_already_higher_is_kept_and_a_lower_one_raised() {
        assert_eq!(wanted_nice(0), CONTROL_NICE);
        assert_eq!(wanted_nice(19), CONTROL_NICE);
        assert_eq!(wanted_nice(-15), -15);
        assert_eq!(wanted_nice(CONTROL_NICE), CONTROL_NICE);
    }

    #[test]
    fn only_the_calling_thread_is_raised() {
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() } as libc::id_t;
        let before = nice_of(me).unwrap();
        // A new thread starts at its creator's nice value.
        let raised = std::thread::spawn(raise_this_thread)
            .join()
            .unwrap()
            .expect("raising a thread's priority (the tests run as root)");
        assert_eq!(raised, wanted_nice(before));
        assert_eq!(nice_of(me).unwrap(), before, "the caller's own thread only");
    }
}
