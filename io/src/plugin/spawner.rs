//! Plugin processes are started from one thread that lives as long as the
//! daemon. `PR_SET_PDEATHSIG` fires when the *thread* that forked a child
//! exits, so forking from a pooled thread that later idles out would kill
//! healthy plugins; forking from this thread makes the signal mean what we
//! want: the daemon died (even by SIGKILL), so its plugins die with it.

use nix::sys::signal::Signal;
use nix::unistd::{getppid, Pid};
use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

type Request = (Command, mpsc::Sender<io::Result<Child>>);

static SPAWNER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();

/// Starts `cmd` as a child that is SIGKILLed when this process dies.
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

fn spawn_here(mut cmd: Command) -> io::Result<Child> {
    let parent = Pid::this();
    // SAFETY: the closure runs in the forked child before exec and calls
    // only async-signal-safe functions (prctl, getppid).
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)?;
            // The parent may have died between fork and prctl.
            if getppid() != parent {
                return Err(io::Error::other("the daemon exited while starting this plugin"));
            }
            Ok(())
        });
    }
    cmd.spawn()
}
