//! Plugin processes, and every process they start, die with the daemon.
//!
//! `sh -c CMD` may fork before it runs CMD, and a plugin may start children
//! of its own, so a signal to the shell alone leaves orphans that go on
//! writing. Each plugin therefore runs under a watchdog: the process the
//! daemon forks makes a new process group, forks the plugin into it, closes
//! every descriptor it inherited, and then only watches. When the plugin
//! exits, the watchdog kills what is left of the group and exits the same
//! way; when the daemon dies (even by SIGKILL: the watchdog's parent
//! changes), it kills the whole group, itself included. The daemon stops a
//! plugin by killing the group ([`kill_tree`]). The watchdog is the `Child`
//! the daemon holds; its pid is the group's id.
//!
//! A descendant that leaves the group on purpose (`setsid`, a daemonizing
//! fork) is out of reach: PROTOCOL.md asks plugins not to.
//!
//! Children are forked from one thread that lives as long as the daemon:
//! `PR_SET_PDEATHSIG` (which the watchdog's plugin also gets, against the
//! watchdog's death) fires when the *thread* that forked exits.

use nix::libc;
use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, getppid, setpgid, ForkResult, Pid};
use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

type Request = (Command, mpsc::Sender<io::Result<Child>>);

static SPAWNER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();

/// How often a watchdog looks at its plugin and at its parent.
const WATCH_EVERY: Duration = Duration::from_millis(20);

/// Starts `cmd` under a watchdog (above): it and everything it starts in
/// its process group die when it exits, when [`kill_tree`] is called, or when
/// this process dies.
pub fn spawn(cmd: Command) -> io::Result<Child> {
    let sender = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("plugin-spawner".into())
            .spawn(move || {
                for (cmd, reply) in rx {
                    let _ = reply.send(spawn_here(cmd));
                }
            })
            .expect("the spawner thread starts");
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    sender.lock().expect("not poisoned").send((cmd, reply_tx)).map_err(|_| io::Error::other("spawner gone"))?;
    reply_rx.recv().map_err(|_| io::Error::other("spawner gone"))?
}

/// Kills a plugin started by [`spawn`] and every process of its group, and
/// reaps the watchdog.
pub fn kill_tree(child: &mut Child) {
    let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
    let _ = child.kill();
    let _ = child.wait();
}

fn spawn_here(mut cmd: Command) -> io::Result<Child> {
    let daemon = Pid::this();
    // SAFETY: the closure runs in the forked child of a multi-threaded
    // process, before exec: it calls only async-signal-safe functions
    // (setpgid, fork, prctl, getppid, waitpid, kill, nanosleep, close,
    // _exit) and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            setpgid(Pid::from_raw(0), Pid::from_raw(0)).map_err(io::Error::from)?;
            let watchdog = Pid::this();
            match fork().map_err(io::Error::from)? {
                ForkResult::Child => {
                    // The plugin: it dies if its watchdog does.
                    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)?;
                    if getppid() != watchdog {
                        libc::_exit(127);
                    }
                    Ok(())
                }
                ForkResult::Parent { child } => watch(daemon, child),
            }
        });
    }
    cmd.spawn()
}

/// The watchdog's life: never returns.
///
/// # Safety
/// Runs in a forked child before exec (see `spawn_here`).
unsafe fn watch(daemon: Pid, plugin: Pid) -> ! {
    // Nothing of the daemon's stays open here: not its lock file, its
    // sockets, nor the plugin's pipes (whose ends the daemon reads to EOF).
    if libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32) != 0 {
        for fd in 0..4096 {
            libc::close(fd);
        }
    }
    let group = Pid::this();
    loop {
        if getppid() != daemon {
            // The daemon is gone: the whole group goes, this process too.
            let _ = killpg(group, Signal::SIGKILL);
            libc::_exit(137);
        }
        match waitpid(plugin, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(nix::errno::Errno::EINTR) => {}
            Ok(WaitStatus::Exited(_, code)) => finish(group, None, code),
            Ok(WaitStatus::Signaled(_, signal, _)) => finish(group, Some(signal), 128 + signal as i32),
            Ok(_) => {}
            Err(_) => finish(group, None, 127),
        }
        libc::usleep(WATCH_EVERY.as_micros() as u32);
    }
}

/// The plugin ended: the rest of its group goes (this process leaves the
/// group first), then the watchdog ends the way the plugin did.
unsafe fn finish(group: Pid, signal: Option<Signal>, code: i32) -> ! {
    // Where leaving fails (the daemon just died), the kill takes this
    // process too, which is what the daemon's death asks for anyway.
    if let Ok(daemons) = nix::unistd::getpgid(Some(getppid())) {
        let _ = setpgid(Pid::from_raw(0), daemons);
    }
    let _ = killpg(group, Signal::SIGKILL);
    if let Some(signal) = signal {
        libc::signal(signal as i32, libc::SIG_DFL);
        let _ = kill(Pid::this(), signal);
    }
    libc::_exit(code)
}
