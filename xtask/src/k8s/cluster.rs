//! A control plane on this host, for as long as a check runs: etcd and kube-apiserver on
//! loopback, the API server's own self-signed serving certificate, a token in
//! `system:masters` for kubectl, a service-account key pair, RBAC. No controller manager,
//! scheduler or kubelet: objects are stored and validated, nothing runs.
//!
//! Every file (data, certificates, logs, the kubeconfig) lives in one directory, removed at the
//! end. The processes are stopped by their PIDs, SIGTERM and then SIGKILL after a timeout (an
//! API server has been seen ignoring SIGTERM for 30 s), and die with this process if it dies
//! first.

use std::{
    fs::File,
    net::TcpListener,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::tools::Tools;
use crate::run_status;

/// How long the API server may take to answer /readyz (about 3 s on an idle machine).
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a process may take to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Cluster {
    dir: PathBuf,
    kubectl: PathBuf,
    kubeconfig: PathBuf,
    /// Started in this order, stopped in the reverse.
    processes: Vec<Process>,
}

struct Process {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Cluster {
    /// Starts etcd and the API server with their files in `dir` (created, and removed by
    /// [`Cluster::stop`]), and waits until the API server is ready and has made its system
    /// namespaces.
    pub fn start(tools: &Tools, dir: &Path) -> Result<Self> {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir)?;
        let mut cluster = Self {
            dir: dir.to_path_buf(),
            kubectl: tools.kubectl.clone(),
            kubeconfig: dir.join("kubeconfig"),
            processes: Vec::new(),
        };
        let etcd_port = free_port()?;
        let etcd_peer_port = free_port()?;
        cluster.spawn(
            "etcd",
            Command::new(&tools.etcd)
                .arg(format!("--data-dir={}", dir.join("etcd").display()))
                .arg(format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"))
                .arg(format!(
                    "--advertise-client-urls=http://127.0.0.1:{etcd_port}"
                ))
                .arg(format!(
                    "--listen-peer-urls=http://127.0.0.1:{etcd_peer_port}"
                ))
                .arg(format!(
                    "--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer_port}"
                ))
                .arg(format!(
                    "--initial-cluster=default=http://127.0.0.1:{etcd_peer_port}"
                ))
                // With etcd's default (none), a watch with a field selector on an idle
                // resource fails with "Too large resource version".
                .arg("--experimental-watch-progress-notify-interval=5s"),
        )?;

        let token = random_hex(16)?;
        std::fs::write(
            dir.join("tokens.csv"),
            format!("{token},check-admin,check-admin,\"system:masters\"\n"),
        )?;
        let sa_key = dir.join("service-account.key");
        let sa_pub = dir.join("service-account.pub");
        run_status(
            Command::new("openssl")
                .args(["genpkey", "-quiet", "-algorithm", "RSA", "-out"])
                .arg(&sa_key)
                .stderr(Stdio::null()),
        )?;
        run_status(
            Command::new("openssl")
                .args(["pkey", "-pubout", "-in"])
                .arg(&sa_key)
                .arg("-out")
                .arg(&sa_pub),
        )?;
        let certs = dir.join("certs");
        let port = free_port()?;
        cluster.spawn(
            "kube-apiserver",
            Command::new(&tools.apiserver)
                .arg(format!("--etcd-servers=http://127.0.0.1:{etcd_port}"))
                .arg("--bind-address=127.0.0.1")
                .arg("--advertise-address=127.0.0.1")
                // No `kubernetes` Service endpoints: nothing runs in the cluster to reach it,
                // and the reconciler refuses a loopback address.
                .arg("--endpoint-reconciler-type=none")
                .arg(format!("--secure-port={port}"))
                // No certificate given: it makes a self-signed one (and its CA) here.
                .arg(format!("--cert-dir={}", certs.display()))
                .arg(format!(
                    "--token-auth-file={}",
                    dir.join("tokens.csv").display()
                ))
                .arg("--authorization-mode=Node,RBAC")
                .arg(format!("--service-account-key-file={}", sa_pub.display()))
                .arg(format!(
                    "--service-account-signing-key-file={}",
                    sa_key.display()
                ))
                .arg("--service-account-issuer=https://kubernetes.default.svc")
                .arg("--service-cluster-ip-range=10.96.0.0/16"),
        )?;

        std::fs::write(
            &cluster.kubeconfig,
            kubeconfig(port, &certs.join("apiserver.crt"), &token),
        )?;
        cluster.wait_ready()?;
        Ok(cluster)
    }

    fn spawn(&mut self, name: &'static str, cmd: &mut Command) -> Result<()> {
        let log = self.dir.join(format!("{name}.log"));
        let out = File::create(&log)?;
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                // Dies with this process: an interrupted check leaves nothing running.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        println!("k8s: {name} started (pid {})", child.id());
        self.processes.push(Process { name, child, log });
        Ok(())
    }

    /// Until /readyz answers and the `kube-system` namespace exists, or a process ended.
    fn wait_ready(&mut self) -> Result<()> {
        let start = Instant::now();
        loop {
            for p in &mut self.processes {
                if let Some(status) = p.child.try_wait()? {
                    bail!("{} exited ({status}):\n{}", p.name, tail(&p.log));
                }
            }
            let ready = self
                .kubectl()
                .args(["get", "--raw=/readyz"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
                && self
                    .kubectl()
                    .args(["get", "namespace", "kube-system"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
            if ready {
                println!(
                    "k8s: API server ready after {:.1} s",
                    start.elapsed().as_secs_f64()
                );
                return Ok(());
            }
            if start.elapsed() > READY_TIMEOUT {
                let log = &self.processes.last().context("no API server")?.log;
                bail!(
                    "the API server was not ready after {} s:\n{}",
                    READY_TIMEOUT.as_secs(),
                    tail(log)
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// kubectl, talking to this cluster.
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(&self.kubectl);
        cmd.arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .stdin(Stdio::null());
        cmd
    }

    /// Stops every process (SIGTERM, SIGKILL after a timeout) and removes the directory.
    /// Reports a process that had to be killed, or that had ended before, as an error.
    pub fn stop(mut self) -> Result<()> {
        let mut faults = Vec::new();
        while let Some(mut p) = self.processes.pop() {
            match stop(&mut p.child) {
                Ok(Stopped::Exited) => println!("k8s: {} stopped", p.name),
                Ok(Stopped::Killed) => faults.push(format!(
                    "{} did not exit within {} s of SIGTERM and was killed",
                    p.name,
                    STOP_TIMEOUT.as_secs()
                )),
                Ok(Stopped::AlreadyEnded(status)) => faults.push(format!(
                    "{} had ended before the stop ({status}):\n{}",
                    p.name,
                    tail(&p.log)
                )),
                Err(e) => faults.push(format!("stopping {}: {e}", p.name)),
            }
        }
        std::fs::remove_dir_all(&self.dir)
            .with_context(|| format!("removing {}", self.dir.display()))?;
        if !faults.is_empty() {
            bail!("{}", faults.join("\n"));
        }
        Ok(())
    }
}

impl Drop for Cluster {
    /// A check that failed half-way leaves nothing running (its files stay, for the logs).
    fn drop(&mut self) {
        while let Some(mut p) = self.processes.pop() {
            let _ = stop(&mut p.child);
            eprintln!("k8s: {} stopped; its log: {}", p.name, p.log.display());
        }
    }
}

enum Stopped {
    Exited,
    Killed,
    AlreadyEnded(std::process::ExitStatus),
}

fn stop(child: &mut Child) -> Result<Stopped> {
    if let Some(status) = child.try_wait()? {
        return Ok(Stopped::AlreadyEnded(status));
    }
    let pid = i32::try_from(child.id())?;
    // SAFETY: kill(2) on our own child, which has not been reaped (try_wait saw it running).
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + STOP_TIMEOUT;
    while Instant::now() < deadline {
        if child.try_wait()?.is_some() {
            return Ok(Stopped::Exited);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    child.kill()?;
    child.wait()?;
    Ok(Stopped::Killed)
}

/// A port free on loopback now (the kernel's pick; the process that binds it next is ours).
fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn random_hex(bytes: usize) -> Result<String> {
    let mut buf = vec![0u8; bytes];
    std::io::Read::read_exact(&mut File::open("/dev/urandom")?, &mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

fn kubeconfig(port: u16, ca: &Path, token: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
  - name: check
    cluster:
      server: https://127.0.0.1:{port}
      certificate-authority: {ca}
users:
  - name: check-admin
    user:
      token: {token}
contexts:
  - name: check
    context:
      cluster: check
      user: check-admin
current-context: check
",
        ca = ca.display()
    )
}

/// A log's errors (klog's `E` and `F` lines, etcd's `E` and `C`) and its last lines, for an
/// error: an API server that fails says why early, and goes on logging.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let is_error = |l: &str| {
        let klog = l.len() > 1 && l.starts_with(['E', 'F']) && l.as_bytes()[1].is_ascii_digit();
        klog || l.contains(" E | ") || l.contains(" C | ")
    };
    let errors: Vec<&str> = lines.iter().copied().filter(|l| is_error(l)).collect();
    let last = &lines[lines.len().saturating_sub(15)..];
    format!(
        "{}\n...\n{}\n(the whole log: {})",
        errors[errors.len().saturating_sub(10)..].join("\n"),
        last.join("\n"),
        log.display()
    )
}
