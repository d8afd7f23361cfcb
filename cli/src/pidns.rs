//! `vgpu run`'s container init: the command runs in a new PID namespace, as in a pod, so
//! that it (and NVML, and `nvidia-smi`) sees only the container's processes.
//!
//! `vgpu run` unshares a PID namespace and forks its init (PID 1 there), which mounts a
//! `/proc` of the namespace (in `vgpu run`'s private mount namespace), starts the command
//! as PID 2, reaps every process of the namespace (orphans included, so no zombie ever
//! looks alive), forwards SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 to the command (SIGINT and
//! SIGQUIT from a terminal reach the whole foreground group already), and when the
//! command ends kills what is left, reaps it, and frees the usage-region slots its
//! processes left behind (killed processes never detach; no process outside the
//! namespace can judge them). Then it exits with the command's status, which `vgpu run`
//! returns. If `vgpu run` itself dies, the init gets SIGTERM (parent-death signal) and
//! passes it on.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};

use anyhow::{Result, bail};
use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};

/// The PID signals are forwarded to: the command (in the init) or the init (in `vgpu run`).
static FORWARD_TO: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(signal: libc::c_int) {
    let pid = FORWARD_TO.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe; the PID is our own child.
        unsafe { libc::kill(pid, signal) };
    }
}

extern "C" fn ignore(_: libc::c_int) {}

/// Forwards the termination signals to `FORWARD_TO`, and keeps SIGINT/SIGQUIT from
/// killing us (handlers, not SIG_IGN, which exec would pass on).
fn install_handlers() {
    let handler = |f: extern "C" fn(libc::c_int)| f as *const () as libc::sighandler_t;
    // SAFETY: installing handlers that only call async-signal-safe functions.
    unsafe {
        for signal in [libc::SIGTERM, libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2] {
            libc::signal(signal, handler(forward));
        }
        libc::signal(libc::SIGINT, handler(ignore));
        libc::signal(libc::SIGQUIT, handler(ignore));
    }
}

/// `waitpid` until `pid` ends, through interruptions; its status.
fn wait_for(pid: libc::pid_t) -> Option<libc::c_int> {
    loop {
        let mut status = 0;
        // SAFETY: waiting for our own child with a valid out-pointer.
        let done = unsafe { libc::waitpid(pid, &mut status, 0) };
        if done == pid {
            return Some(status);
        }
        if done < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return None;
        }
    }
}

/// A shell-style exit code of a wait status.
fn exit_code(status: libc::c_int) -> i32 {
    let status = std::process::ExitStatus::from_raw(status);
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// Runs `command` as PID 2 of a new PID namespace (see the module doc), and returns its
/// exit code. `region` is the container's usage region, whose slots left by the
/// namespace's processes are freed at the end.
pub fn run(command: Command, region: Option<PathBuf>) -> Result<i32> {
    // Only this process's children enter the new namespace.
    if let Err(error) = unshare(CloneFlags::CLONE_NEWPID) {
        bail!("cannot create a PID namespace ({error}); run with --host-pid to share the host's");
    }
    // SAFETY: the child runs only the init below. `vgpu run` may have one other thread
    // here (the coordinator's, which holds no lock the init takes: it never writes the
    // environment, and glibc's malloc is made fork-safe by its own atfork handlers). It
    // cannot start after this point: once unshare(CLONE_NEWPID) has run, this process
    // can no longer create threads (EINVAL).
    let init = unsafe { libc::fork() };
    if init < 0 {
        bail!("fork: {}", std::io::Error::last_os_error());
    }
    if init == 0 {
        std::process::exit(container_init(command, region));
    }
    FORWARD_TO.store(init, Ordering::Relaxed);
    install_handlers();
    match wait_for(init) {
        Some(status) => Ok(exit_code(status)),
        None => bail!(
            "waiting for the container init: {}",
            std::io::Error::last_os_error()
        ),
    }
}

/// PID 1 of the new namespace; returns the exit code.
fn container_init(mut command: Command, region: Option<PathBuf>) -> i32 {
    // SAFETY: prctl with a signal number; the init passes SIGTERM on to the command.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) };
    install_handlers();
    // The namespace's /proc goes into a mount namespace of the init's own: `vgpu run`'s
    // coordinator thread keeps the host's /proc, where it finds containers' processes by
    // their host PIDs (NVML's, from the host). The binds `vgpu run` made are copied in.
    // `vgpu run` made every mount private, so nothing the init mounts propagates back.
    if let Err(error) = unshare(CloneFlags::CLONE_NEWNS) {
        eprintln!("vgpu run: cannot give the PID namespace its own mounts: {error}");
        return 1;
    }
    // A proc of this (new) PID namespace over /proc, in the init's own mount namespace.
    let proc_flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    if let Err(error) = mount(
        Some("proc"),
        "/proc",
        Some("proc"),
        proc_flags,
        None::<&str>,
    ) {
        eprintln!("vgpu run: cannot mount /proc for the PID namespace: {error}");
        return 1;
    }
    let program = command.get_program().to_string_lossy().into_owned();
    let child = match command.spawn() {
        Ok(child) => child,
        Err(error) => {
            eprintln!("vgpu run: cannot run {program}: {error}");
            return 127;
        }
    };
    let child = child.id() as libc::pid_t;
    FORWARD_TO.store(child, Ordering::Relaxed);
    // Reap everything (orphans reparent to us) until the command itself ends.
    let mut code = 1;
    loop {
        let mut status = 0;
        // SAFETY: waiting for any child of ours with a valid out-pointer.
        let done = unsafe { libc::waitpid(-1, &mut status, 0) };
        if done == child {
            code = exit_code(status);
            break;
        }
        if done < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break;
        }
    }
    FORWARD_TO.store(0, Ordering::Relaxed);
    // The container ends with its command: what is left goes, as when a pod's init ends.
    // SAFETY: from PID 1 of a namespace, kill(-1) signals every other process of it.
    unsafe { libc::kill(-1, libc::SIGKILL) };
    reap_all();
    if let Some(region) = region
        && let Err(error) = vgpu_contract::snapshot::reclaim_dead(&region)
    {
        eprintln!("vgpu run: {error}; the slots of killed processes stay");
    }
    code
}

/// Reaps every child until none is left.
fn reap_all() {
    loop {
        // SAFETY: waiting for any child, status not wanted.
        let done = unsafe { libc::waitpid(-1, std::ptr::null_mut(), 0) };
        if done < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}
