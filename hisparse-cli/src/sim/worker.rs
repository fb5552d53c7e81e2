//! Worker processes of this executable, for `simulate --tp N` (the ranks) and `simulate --pd
//! nixl` (the prefill side): one bootstrap for both. The coordinator starts this executable
//! with a hidden subcommand, sends it a hello (one JSON line on its stdin), then messages; the
//! worker answers one JSON line per message on its stdout. A thread reads the answers, so the
//! coordinator can wait for one or only look whether one arrived. A worker that fails says so
//! in an answer ([`Answer::failure`]) before it exits; a worker left running when its handle
//! goes (a failed run) is killed.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, BufWriter, StdinLock, StdoutLock, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{CliError, CliResult};

/// Writes `msg` as one line of JSON and flushes.
pub fn send<T: Serialize>(w: &mut impl Write, msg: &T) -> std::io::Result<()> {
    serde_json::to_writer(&mut *w, msg)?;
    w.write_all(b"\n")?;
    w.flush()
}

/// Reads one line of JSON (waiting for it).
pub fn recv<T: DeserializeOwned>(r: &mut impl BufRead, line: &mut String) -> Result<T, String> {
    line.clear();
    match r.read_line(line) {
        Ok(0) => Err("the pipe closed".into()),
        Ok(_) => serde_json::from_str(line).map_err(|e| format!("a malformed message ({e})")),
        Err(e) => Err(e.to_string()),
    }
}

/// A worker's answer: one of them says the worker failed.
pub trait Answer: DeserializeOwned + Send + 'static {
    /// The worker's failure, when this answer reports one.
    fn failure(&self) -> Option<&str>;
}

/// A worker process, seen from the coordinator.
pub struct WorkerProcess<A: Answer> {
    /// How messages name it: `rank 2`, `the prefill side`.
    who: String,
    child: Child,
    to: BufWriter<ChildStdin>,
    from: Receiver<Result<A, String>>,
}

impl<A: Answer> WorkerProcess<A> {
    /// Starts this executable with `subcommand` (and the environment `env` besides this
    /// process's) and sends it `hello`.
    pub fn start(
        subcommand: &str,
        who: String,
        env: &[(&str, OsString)],
        hello: &impl Serialize,
    ) -> CliResult<Self> {
        let exe = std::env::current_exe().map_err(|e| {
            CliError::failed(format!("cannot find this executable to start {who}: {e}"))
        })?;
        let mut child = Command::new(exe)
            .arg(subcommand)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| CliError::failed(format!("cannot start {who}: {e}")))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(CliError::failed(format!("no pipes to {who}")));
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut line = String::new();
            loop {
                let msg = recv::<A>(&mut r, &mut line);
                let last = msg.is_err();
                if tx.send(msg).is_err() || last {
                    return;
                }
            }
        });
        let mut w = WorkerProcess {
            who,
            child,
            to: BufWriter::new(stdin),
            from: rx,
        };
        w.send(hello)?;
        Ok(w)
    }

    /// Sends `msg`.
    pub fn send<T: Serialize>(&mut self, msg: &T) -> CliResult<()> {
        send(&mut self.to, msg)
            .map_err(|e| CliError::failed(format!("cannot send to {}: {e}", self.who)))
    }

    /// The worker stopped answering: why, and its exit status if it exited.
    fn stopped(&mut self, e: &str) -> CliError {
        let status = self.child.try_wait().ok().flatten();
        CliError::failed(format!(
            "{} stopped answering ({e}{})",
            self.who,
            status
                .map(|s| format!("; it exited with {s}"))
                .unwrap_or_default()
        ))
    }

    fn answer(&mut self, got: Result<A, String>) -> CliResult<A> {
        match got {
            Ok(a) => match a.failure() {
                Some(m) => Err(CliError::failed(format!("{}: {m}", self.who))),
                None => Ok(a),
            },
            Err(e) => Err(self.stopped(&e)),
        }
    }

    /// The next answer, waiting for it.
    pub fn recv(&mut self) -> CliResult<A> {
        match self.from.recv() {
            Ok(got) => self.answer(got),
            Err(_) => Err(self.stopped("the pipe closed")),
        }
    }

    /// The next answer, waiting at most `timeout`.
    #[cfg_attr(not(feature = "nixl"), allow(dead_code))]
    pub fn recv_within(&mut self, timeout: Duration) -> CliResult<A> {
        match self.from.recv_timeout(timeout) {
            Ok(got) => self.answer(got),
            Err(RecvTimeoutError::Timeout) => {
                Err(self.stopped(&format!("nothing for {} s", timeout.as_secs())))
            }
            Err(RecvTimeoutError::Disconnected) => Err(self.stopped("the pipe closed")),
        }
    }

    /// An answer if one arrived (never waits).
    #[cfg_attr(not(feature = "nixl"), allow(dead_code))]
    pub fn try_recv(&mut self) -> CliResult<Option<A>> {
        match self.from.try_recv() {
            Ok(got) => self.answer(got).map(Some),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(self.stopped("the pipe closed")),
        }
    }

    /// Waits for the worker to exit; anything but success is an error.
    pub fn wait(&mut self) -> CliResult<()> {
        let status = self
            .child
            .wait()
            .map_err(|e| CliError::failed(format!("{}: {e}", self.who)))?;
        if !status.success() {
            return Err(CliError::failed(format!(
                "{} exited with {status}",
                self.who
            )));
        }
        Ok(())
    }
}

impl<A: Answer> Drop for WorkerProcess<A> {
    fn drop(&mut self) {
        // A run that failed leaves no worker behind.
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The worker side: reads the hello `H` on stdin (a process not started by a coordinator is
/// told `started_by`), runs `serve` over stdin and stdout, and answers its failure with
/// `failed` before returning it.
pub fn serve_worker<H: DeserializeOwned, A: Serialize>(
    started_by: &str,
    failed: impl Fn(String) -> A,
    serve: impl FnOnce(H, &mut StdinLock<'static>, &mut BufWriter<StdoutLock<'static>>) -> CliResult<()>,
) -> CliResult<()> {
    let mut input = std::io::stdin().lock();
    let mut output = BufWriter::new(std::io::stdout().lock());
    let mut line = String::new();
    let hello: H = recv(&mut input, &mut line)
        .map_err(|e| CliError::failed(format!("{started_by}, not by hand ({e})")))?;
    let result = serve(hello, &mut input, &mut output);
    if let Err(e) = &result {
        let _ = send(&mut output, &failed(e.to_string()));
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    enum Reply {
        Value(u32),
        Failed(String),
    }

    impl Answer for Reply {
        fn failure(&self) -> Option<&str> {
            match self {
                Reply::Failed(m) => Some(m),
                Reply::Value(_) => None,
            }
        }
    }

    #[test]
    fn messages_are_one_json_line_each_and_a_closed_or_garbled_pipe_says_so() {
        let mut pipe = Vec::new();
        send(&mut pipe, &Reply::Value(7)).unwrap();
        send(&mut pipe, &Reply::Failed("no device".into())).unwrap();
        pipe.extend_from_slice(b"{not json\n");
        assert_eq!(pipe.iter().filter(|&&b| b == b'\n').count(), 3);
        let mut r = std::io::Cursor::new(pipe);
        let mut line = String::new();
        assert_eq!(recv::<Reply>(&mut r, &mut line), Ok(Reply::Value(7)));
        let failed = recv::<Reply>(&mut r, &mut line).unwrap();
        assert_eq!(failed.failure(), Some("no device"));
        let e = recv::<Reply>(&mut r, &mut line).unwrap_err();
        assert!(e.starts_with("a malformed message"), "{e}");
        assert_eq!(
            recv::<Reply>(&mut r, &mut line).unwrap_err(),
            "the pipe closed"
        );
    }
}
