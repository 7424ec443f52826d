//! SIGTERM and SIGINT become one shutdown request for the engine.

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

pub fn listen() -> mpsc::Receiver<()> {
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        let _ = tx.send(()).await;
        // Keep the handlers installed: a second signal must not kill the
        // drain by default action.
        loop {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
    });
    rx
}
