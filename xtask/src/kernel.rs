//! Debian kernels for the test VM, downloaded once into the cache, and their modules.
//!
//! The `linux-image-*-cloud-amd64` packages hold the kernel and its modules but no
//! `modules.dep`, and this machine has no depmod: module dependencies are read from each
//! module's own `.modinfo` (`depends=`).

use std::{
    collections::{BTreeMap, HashSet},
    fmt,
    path::{Path, PathBuf},
    process::Command,
    str::FromStr,
};

use anyhow::{Context, Result, bail};

use crate::{cache_dir, run_quiet, run_status};

/// The kernels the project is tested on: Debian 12's own (netlink clsact attach) and the
/// backported 6.12 (TCX attach).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    V6_1,
    V6_12,
}

impl Kernel {
    pub const ALL: [Kernel; 2] = [Kernel::V6_1, Kernel::V6_12];

    /// The Debian meta package that depends on the current image of this series.
    fn meta_package(self) -> &'static str {
        match self {
            Kernel::V6_1 => "linux-image-cloud-amd64",
            Kernel::V6_12 => "linux-image-6.12-cloud-amd64",
        }
    }

    fn series(self) -> &'static str {
        match self {
            Kernel::V6_1 => "6.1",
            Kernel::V6_12 => "6.12",
        }
    }
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.series())
    }
}

impl FromStr for Kernel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "6.1" => Ok(Kernel::V6_1),
            "6.12" => Ok(Kernel::V6_12),
            _ => Err(format!("unknown kernel {s:?}: expected 6.1 or 6.12")),
        }
    }
}

/// An unpacked kernel package.
pub struct KernelTree {
    pub kernel: Kernel,
    pub release: String,
    pub vmlinuz: PathBuf,
    pub modules: PathBuf,
}

/// The unpacked image of `kernel`, downloading it if the cache does not hold it yet. When the
/// archive cannot be reached, the last image cached for the series is used.
pub fn fetch(kernel: Kernel) -> Result<KernelTree> {
    let dir = cache_dir().join("kernels");
    std::fs::create_dir_all(&dir)?;
    let current = dir.join(format!("{}.current", kernel.series()));
    let package = match resolve_package(kernel) {
        Ok(p) => p,
        Err(e) => match std::fs::read_to_string(&current) {
            Ok(p) => {
                eprintln!("note: {e:#}; using the cached {}", p.trim());
                p.trim().to_string()
            }
            Err(_) => return Err(e),
        },
    };
    let root = dir.join(&package);
    if !root.join(".complete").exists() {
        download(&package, &root)?;
    }
    std::fs::write(&current, &package)?;
    tree(kernel, &root)
}

fn resolve_package(kernel: Kernel) -> Result<String> {
    let depends = |refresh: bool| -> Result<Option<String>> {
        if refresh {
            run_status(Command::new("apt-get").args(["update", "-qq"]))?;
        }
        let out = run_quiet(Command::new("apt-cache").args(["depends", kernel.meta_package()]));
        Ok(out.ok().and_then(|out| {
            out.lines()
                .filter_map(|l| l.trim().strip_prefix("Depends: "))
                .find(|p| p.starts_with("linux-image-"))
                .map(str::to_string)
        }))
    };
    let package = match depends(false)? {
        Some(p) => p,
        None => depends(true)?.with_context(|| {
            format!(
                "apt knows no {} (is Debian's archive reachable?)",
                kernel.meta_package()
            )
        })?,
    };
    let version = package.trim_start_matches("linux-image-");
    if !(version.starts_with(&format!("{}.", kernel.series()))
        || version.starts_with(&format!("{}-", kernel.series())))
    {
        bail!(
            "{} resolves to {package}, not a {} kernel",
            kernel.meta_package(),
            kernel.series()
        );
    }
    Ok(package)
}

fn download(package: &str, root: &Path) -> Result<()> {
    println!("vm: downloading {package} (once)");
    let work = root.with_extension("download");
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(root);
    std::fs::create_dir_all(&work)?;
    let fetch = || {
        run_status(Command::new("apt-get").current_dir(&work).args([
            "download",
            "-qq",
            "-o",
            "APT::Sandbox::User=root",
            package,
        ]))
    };
    if fetch().is_err() {
        run_status(Command::new("apt-get").args(["update", "-qq"]))?;
        fetch().with_context(|| format!("downloading {package}"))?;
    }
    let deb = std::fs::read_dir(&work)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .context("apt-get download produced no .deb")?;
    run_status(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(root))?;
    std::fs::remove_dir_all(&work)?;
    std::fs::write(root.join(".complete"), "")?;
    Ok(())
}

fn tree(kernel: Kernel, root: &Path) -> Result<KernelTree> {
    let vmlinuz = std::fs::read_dir(root.join("boot"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
        })
        .with_context(|| format!("no vmlinuz in {}", root.display()))?;
    let release = vmlinuz.file_name().unwrap().to_string_lossy()["vmlinuz-".len()..].to_string();
    let modules = ["lib/modules", "usr/lib/modules"]
        .iter()
        .map(|d| root.join(d).join(&release))
        .find(|p| p.is_dir())
        .with_context(|| format!("no modules for {release} in {}", root.display()))?;
    Ok(KernelTree {
        kernel,
        release,
        vmlinuz,
        modules,
    })
}

/// A module ready for insmod: its name and uncompressed contents.
pub struct Module {
    pub name: String,
    pub data: Vec<u8>,
}

impl KernelTree {
    /// `wanted` modules and everything they depend on, dependencies first. Modules built into
    /// this kernel are skipped; a module that is neither present nor built in is an error
    /// unless it is in `optional`.
    pub fn modules_for(&self, wanted: &[&str], optional: &[&str]) -> Result<Vec<Module>> {
        let index = self.index()?;
        let builtin =
            std::fs::read_to_string(self.modules.join("modules.builtin")).unwrap_or_default();
        let builtin: HashSet<String> = builtin.lines().filter_map(module_name).collect();
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        for name in wanted.iter().chain(optional) {
            let name = name.replace('-', "_");
            if builtin.contains(&name) {
                continue;
            }
            if !index.contains_key(&name) {
                if optional.iter().any(|o| o.replace('-', "_") == name) {
                    continue;
                }
                bail!("Linux {} has no module {name}", self.release);
            }
            self.visit(&name, &index, &builtin, &mut seen, &mut out)?;
        }
        Ok(out)
    }

    fn visit(
        &self,
        name: &str,
        index: &BTreeMap<String, PathBuf>,
        builtin: &HashSet<String>,
        seen: &mut HashSet<String>,
        out: &mut Vec<Module>,
    ) -> Result<()> {
        if !seen.insert(name.to_string()) || builtin.contains(name) {
            return Ok(());
        }
        let path = index
            .get(name)
            .with_context(|| format!("module dependency {name} not found in {}", self.release))?;
        let data = decompress(path)?;
        for dep in depends(&data) {
            self.visit(&dep, index, builtin, seen, out)?;
        }
        out.push(Module {
            name: name.to_string(),
            data,
        });
        Ok(())
    }

    fn index(&self) -> Result<BTreeMap<String, PathBuf>> {
        let mut index = BTreeMap::new();
        let mut stack = vec![self.modules.join("kernel")];
        while let Some(dir) = stack.pop() {
            for e in
                std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
            {
                let path = e?.path();
                if path.is_dir() {
                    stack.push(path);
                } else if let Some(name) = module_name(&path.to_string_lossy()) {
                    index.insert(name, path);
                }
            }
        }
        Ok(index)
    }
}

/// `.../sch_fq.ko.xz` → `sch_fq` (module names use `_` where file names may use `-`).
fn module_name(path: &str) -> Option<String> {
    let file = path.rsplit('/').next()?;
    let stem = file.split_once(".ko")?.0;
    let rest = &file[stem.len() + 3..];
    matches!(rest, "" | ".xz" | ".zst" | ".gz").then(|| stem.replace('-', "_"))
}

fn decompress(path: &Path) -> Result<Vec<u8>> {
    let tool = match path.extension().and_then(|e| e.to_str()) {
        Some("ko") => {
            return std::fs::read(path).with_context(|| format!("reading {}", path.display()));
        }
        Some("xz") => "xz",
        Some("zst") => "zstd",
        Some("gz") => "gzip",
        _ => bail!("unknown module compression: {}", path.display()),
    };
    let out = Command::new(tool)
        .arg("-dc")
        .arg(path)
        .output()
        .with_context(|| format!("running {tool}"))?;
    if !out.status.success() {
        bail!("{tool} -dc {} failed", path.display());
    }
    Ok(out.stdout)
}

/// The `depends=` list from a module's `.modinfo` strings.
fn depends(module: &[u8]) -> Vec<String> {
    const KEY: &[u8] = b"\0depends=";
    let Some(at) = module.windows(KEY.len()).position(|w| w == KEY) else {
        return Vec::new();
    };
    let rest = &module[at + KEY.len()..];
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    String::from_utf8_lossy(&rest[..end])
        .split(',')
        .filter(|d| !d.is_empty())
        .map(|d| d.replace('-', "_"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_names() {
        assert_eq!(module_name("a/b/sch_fq.ko.xz").as_deref(), Some("sch_fq"));
        assert_eq!(
            module_name("kernel/net/sched/sch-cake.ko").as_deref(),
            Some("sch_cake")
        );
        assert_eq!(module_name("kernel/net/sched/sch_fq.ko.sig"), None);
        assert_eq!(module_name("modules.order"), None);
    }

    #[test]
    fn modinfo_depends() {
        let blob = b"\x7fELF...\0license=GPL\0depends=nf_conntrack,libcrc32c\0name=x\0";
        assert_eq!(depends(blob), vec!["nf_conntrack", "libcrc32c"]);
        assert!(depends(b"\0depends=\0name=x").is_empty());
        assert!(depends(b"nothing").is_empty());
    }

    #[test]
    fn kernel_names() {
        assert_eq!("6.1".parse::<Kernel>(), Ok(Kernel::V6_1));
        assert_eq!(Kernel::V6_12.to_string(), "6.12");
        assert!("5.10".parse::<Kernel>().is_err());
    }
}
