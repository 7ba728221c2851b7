//! A writer for the "newc" cpio format the kernel unpacks as an initramfs.
//!
//! Entries are kept by path so that adding the same library twice is harmless, parents are
//! created implicitly, and the archive is written in path order (a parent before its children).

use std::{collections::BTreeMap, io::Write, path::Path};

use anyhow::{Context, Result, bail};

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const S_IFCHR: u32 = 0o020000;

enum Entry {
    Dir,
    File { data: Vec<u8>, mode: u32 },
    Symlink(String),
    CharDev { major: u32, minor: u32 },
}

#[derive(Default)]
pub struct Archive {
    entries: BTreeMap<String, Entry>,
}

fn normalise(path: &str) -> Result<String> {
    let p = path.trim_start_matches('/').trim_end_matches('/');
    if p.is_empty() || p.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        bail!("bad archive path {path:?}");
    }
    Ok(p.to_string())
}

impl Archive {
    fn parents(&mut self, path: &str) {
        let mut end = 0;
        while let Some(i) = path[end..].find('/') {
            end += i;
            self.entries
                .entry(path[..end].to_string())
                .or_insert(Entry::Dir);
            end += 1;
        }
    }

    fn insert(&mut self, path: &str, entry: Entry) -> Result<()> {
        let p = normalise(path)?;
        self.parents(&p);
        self.entries.insert(p, entry);
        Ok(())
    }

    pub fn dir(&mut self, path: &str) -> Result<()> {
        let p = normalise(path)?;
        self.parents(&p);
        self.entries.entry(p).or_insert(Entry::Dir);
        Ok(())
    }

    pub fn file(&mut self, path: &str, data: Vec<u8>, mode: u32) -> Result<()> {
        self.insert(path, Entry::File { data, mode })
    }

    pub fn symlink(&mut self, path: &str, target: &str) -> Result<()> {
        self.insert(path, Entry::Symlink(target.to_string()))
    }

    pub fn char_dev(&mut self, path: &str, major: u32, minor: u32) -> Result<()> {
        self.insert(path, Entry::CharDev { major, minor })
    }

    pub fn contains(&self, path: &str) -> bool {
        normalise(path).is_ok_and(|p| self.entries.contains_key(&p))
    }

    /// Copies a host file, keeping its permission bits.
    pub fn copy_file(&mut self, path: &str, host: &Path) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let data = std::fs::read(host).with_context(|| format!("reading {}", host.display()))?;
        let mode = std::fs::metadata(host)?.permissions().mode() & 0o7777;
        self.file(path, data, mode)
    }

    pub fn write_to(&self, out: &mut impl Write) -> Result<()> {
        let mut written = 0usize;
        for (ino, (path, entry)) in (1u32..).zip(self.entries.iter()) {
            let (mode, data, rdev): (u32, &[u8], (u32, u32)) = match entry {
                Entry::Dir => (S_IFDIR | 0o755, &[], (0, 0)),
                Entry::File { data, mode } => (S_IFREG | mode, data, (0, 0)),
                Entry::Symlink(target) => (S_IFLNK | 0o777, target.as_bytes(), (0, 0)),
                Entry::CharDev { major, minor } => (S_IFCHR | 0o600, &[], (*major, *minor)),
            };
            written += header(out, ino, mode, data.len(), rdev, path)?;
            out.write_all(data)?;
            written += data.len();
            written += pad(out, written)?;
        }
        written += header(out, 0, 0, 0, (0, 0), "TRAILER!!!")?;
        pad(out, written)?;
        Ok(())
    }
}

fn header(
    out: &mut impl Write,
    ino: u32,
    mode: u32,
    size: usize,
    rdev: (u32, u32),
    name: &str,
) -> Result<usize> {
    let nlink = if mode & S_IFDIR == S_IFDIR { 2 } else { 1 };
    let fields = [
        ino,
        mode,
        0,
        0,
        nlink,
        0,
        u32::try_from(size).context("file too large for cpio")?,
        0,
        0,
        rdev.0,
        rdev.1,
        name.len() as u32 + 1,
        0,
    ];
    let mut h = String::from("070701");
    for f in fields {
        h.push_str(&format!("{f:08x}"));
    }
    out.write_all(h.as_bytes())?;
    out.write_all(name.as_bytes())?;
    out.write_all(&[0])?;
    let n = h.len() + name.len() + 1;
    Ok(n + pad(out, n)?)
}

/// Pads to the next multiple of four after `written` bytes; returns the padding written.
fn pad(out: &mut impl Write, written: usize) -> Result<usize> {
    let n = (4 - written % 4) % 4;
    out.write_all(&[0u8; 3][..n])?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_newc_and_aligned() {
        let mut a = Archive::default();
        a.file("/usr/bin/x", b"hello".to_vec(), 0o755).unwrap();
        a.symlink("/link", "elsewhere").unwrap();
        let mut buf = Vec::new();
        a.write_to(&mut buf).unwrap();
        assert_eq!(buf.len() % 4, 0);
        let text = String::from_utf8_lossy(&buf);
        // Parents first, then the file, then the trailer.
        let order: Vec<usize> = [
            "link\0",
            "usr\0",
            "usr/bin\0",
            "usr/bin/x\0",
            "TRAILER!!!\0",
        ]
        .iter()
        .map(|n| text.find(n).unwrap())
        .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
        assert!(text.starts_with("070701"));
        assert!(text.contains("hello"));
    }

    #[test]
    fn rejects_escaping_paths() {
        let mut a = Archive::default();
        assert!(a.file("../etc/passwd", vec![], 0o644).is_err());
        assert!(a.file("/", vec![], 0o644).is_err());
    }
}
