//! `cargo xtask image`: the static `shaper` binary as an OCI image, written as an OCI archive
//! (a tar of an OCI image layout) that containerd (`ctr images import`), podman
//! (`podman load`) and skopeo (`oci-archive:`) read. No container engine, no registry.
//!
//! Reproducible: every byte is a function of the binary and the commit. The layer's tar has
//! fixed owners, modes and times (the commit's), in a fixed order, gzipped without a name or a
//! time; the configuration's `created` is the commit's time; JSON is written with its keys
//! sorted. So the same commit gives the same manifest digest, which is printed.

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};
use oci_spec::image::{
    Arch, ConfigBuilder, Descriptor, HistoryBuilder, ImageConfigurationBuilder, ImageIndexBuilder,
    ImageManifestBuilder, MediaType, Os, RootFsBuilder, SCHEMA_VERSION,
};
use sha2::{Digest, Sha256};

use crate::{bootstrap, dist, run_quiet, workspace_root};

/// Where the binary lives in the image.
const BINARY_PATH: &str = "usr/local/bin/shaper";
/// What the container runs unless told otherwise: the configuration a DaemonSet mounts.
const DEFAULT_ARGS: &[&str] = &["run", "--config", "/etc/shaper/shaper.toml"];

#[derive(clap::Args)]
pub struct Options {
    /// The image's name and tag, as the importing engine lists it (default: shaper:<commit>).
    #[arg(long)]
    pub name: Option<String>,
    /// The archive to write (default: shaper-image.tar in cargo's target directory).
    #[arg(long)]
    pub output: Option<PathBuf>,
}

pub fn run(o: &Options) -> Result<()> {
    bootstrap::ensure()?;
    let (output, name, digest) = build(o.name.as_deref(), o.output.as_deref())?;
    eprintln!("{name} written to {}", output.display());
    eprintln!("  containerd: ctr images import {}", output.display());
    eprintln!("  podman:     podman load -i {}", output.display());
    // The digest alone on stdout, for scripts.
    println!("{digest}");
    Ok(())
}

/// Builds the static binary and writes its image to `output` (default: shaper-image.tar in
/// cargo's target directory) as `name` (default: shaper:<commit>); the archive's path, the
/// name and the manifest's digest.
pub fn build(name: Option<&str>, output: Option<&Path>) -> Result<(PathBuf, String, String)> {
    let binary = dist::build()?;
    let root = workspace_root();
    let git = |args: &[&str]| run_quiet(Command::new("git").current_dir(&root).args(args));
    let epoch: u64 = match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(s) => s.parse().context("SOURCE_DATE_EPOCH")?,
        Err(_) => git(&["log", "-1", "--format=%ct"])?
            .trim()
            .parse()
            .context("the commit's time")?,
    };
    let name = match name {
        Some(name) => name.to_string(),
        None => format!(
            "shaper:{}",
            git(&["rev-parse", "--short=12", "HEAD"])?.trim()
        ),
    };
    let target_dir =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let output = output.map_or_else(|| target_dir.join("shaper-image.tar"), Path::to_path_buf);
    let bytes = std::fs::read(&binary).with_context(|| format!("reading {}", binary.display()))?;
    let image = Image::new(&bytes, epoch)?;
    let archive = image.archive(&name)?;
    anyhow::ensure!(
        verify(&archive)? == image.digest,
        "the archive does not read back as the image written"
    );
    std::fs::write(&output, archive).with_context(|| format!("writing {}", output.display()))?;
    Ok((output, name, image.digest))
}

/// A blob of the layout: its bytes and descriptor.
struct Blob {
    bytes: Vec<u8>,
    descriptor: Descriptor,
}

impl Blob {
    fn new(media_type: MediaType, bytes: Vec<u8>) -> Result<Self> {
        let digest = sha256(&bytes);
        let descriptor = Descriptor::new(
            media_type,
            bytes.len() as u64,
            digest.parse::<oci_spec::image::Digest>()?,
        );
        Ok(Self { bytes, descriptor })
    }
}

/// The image: its layer, configuration and manifest, and the manifest's digest.
struct Image {
    layer: Blob,
    config: Blob,
    manifest: Blob,
    digest: String,
}

impl Image {
    /// The image of `binary`, dated `epoch` (seconds since 1970).
    fn new(binary: &[u8], epoch: u64) -> Result<Self> {
        let tar = layer_tar(binary, epoch)?;
        let diff_id = sha256(&tar);
        let layer = Blob::new(MediaType::ImageLayerGzip, gzip(&tar)?)?;
        let created = rfc3339(epoch);
        let config = ImageConfigurationBuilder::default()
            .created(created.clone())
            .architecture(Arch::Amd64)
            .os(Os::Linux)
            .config(
                ConfigBuilder::default()
                    .entrypoint(vec![format!("/{BINARY_PATH}")])
                    .cmd(
                        DEFAULT_ARGS
                            .iter()
                            .map(|s| s.to_string())
                            .collect::<Vec<_>>(),
                    )
                    .build()?,
            )
            .rootfs(
                RootFsBuilder::default()
                    .typ("layers")
                    .diff_ids(vec![diff_id])
                    .build()?,
            )
            .history(vec![
                HistoryBuilder::default()
                    .created(created)
                    .created_by("cargo xtask image")
                    .build()?,
            ])
            .build()?;
        let config = Blob::new(MediaType::ImageConfig, sorted_json(&config)?)?;
        let manifest = ImageManifestBuilder::default()
            .schema_version(SCHEMA_VERSION)
            .media_type(MediaType::ImageManifest)
            .config(config.descriptor.clone())
            .layers(vec![layer.descriptor.clone()])
            .build()?;
        let manifest = Blob::new(MediaType::ImageManifest, sorted_json(&manifest)?)?;
        let digest = manifest.descriptor.digest().to_string();
        Ok(Self {
            layer,
            config,
            manifest,
            digest,
        })
    }

    /// The OCI archive: `oci-layout`, `index.json` naming the manifest `name`, and the blobs.
    fn archive(&self, name: &str) -> Result<Vec<u8>> {
        let mut manifest = self.manifest.descriptor.clone();
        // containerd names an imported image by this; podman and skopeo by the OCI one, which
        // is the tag only when the name has a registry part (`localhost/shaper:tag`).
        manifest.set_annotations(Some(
            [
                ("io.containerd.image.name".to_string(), name.to_string()),
                (
                    "org.opencontainers.image.ref.name".to_string(),
                    name.to_string(),
                ),
            ]
            .into_iter()
            .collect(),
        ));
        let index = ImageIndexBuilder::default()
            .schema_version(SCHEMA_VERSION)
            .media_type(MediaType::ImageIndex)
            .manifests(vec![manifest])
            .build()?;
        let mut files: Vec<(String, Vec<u8>)> = vec![
            (
                "oci-layout".into(),
                br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
            ),
            ("index.json".into(), sorted_json(&index)?),
        ];
        for blob in [&self.manifest, &self.config, &self.layer] {
            let hex = blob.descriptor.digest().digest().to_string();
            files.push((format!("blobs/sha256/{hex}"), blob.bytes.clone()));
        }
        let mut tar = tar::Builder::new(Vec::new());
        for dir in ["blobs/", "blobs/sha256/"] {
            append(&mut tar, dir, &[], 0o755, 0, tar::EntryType::Directory)?;
        }
        for (path, bytes) in &files {
            append(&mut tar, path, bytes, 0o644, 0, tar::EntryType::Regular)?;
        }
        Ok(tar.into_inner()?)
    }
}

/// The layer: the binary at [`BINARY_PATH`] and its directories, root's, dated `epoch`.
fn layer_tar(binary: &[u8], epoch: u64) -> Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut dir = String::new();
    let (parents, _) = BINARY_PATH
        .rsplit_once('/')
        .expect("a path with directories");
    for part in parents.split('/') {
        dir.push_str(part);
        dir.push('/');
        append(&mut tar, &dir, &[], 0o755, epoch, tar::EntryType::Directory)?;
    }
    append(
        &mut tar,
        BINARY_PATH,
        binary,
        0o755,
        epoch,
        tar::EntryType::Regular,
    )?;
    Ok(tar.into_inner()?)
}

/// One entry, with nothing in its header but what is given: no owner names, ids 0.
fn append(
    tar: &mut tar::Builder<Vec<u8>>,
    path: &str,
    bytes: &[u8],
    mode: u32,
    mtime: u64,
    kind: tar::EntryType,
) -> Result<()> {
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(kind);
    header.set_size(bytes.len() as u64);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(mtime);
    header.set_path(path)?;
    header.set_cksum();
    tar.append(&header, bytes)?;
    Ok(())
}

/// gzip with no name and no time in its header: the same input, the same bytes.
fn gzip(bytes: &[u8]) -> Result<Vec<u8>> {
    let mut encoder = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::best());
    encoder.write_all(bytes)?;
    Ok(encoder.finish()?)
}

pub fn sha256(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// JSON with every object's keys sorted (serde_json's map is ordered by key), whatever order
/// the value's own maps keep.
fn sorted_json<T: serde::Serialize>(value: &T) -> Result<Vec<u8>> {
    Ok(serde_json::to_vec(&serde_json::to_value(value)?)?)
}

/// `epoch` (seconds since 1970, UTC) as RFC 3339.
fn rfc3339(epoch: u64) -> String {
    let days = epoch / 86_400;
    let secs = epoch % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3_600,
        secs % 3_600 / 60,
        secs % 60
    )
}

/// Reads an archive back: the manifest `index.json` names, its configuration and layers, each
/// checked against its digest and size; the manifest's digest.
fn verify(archive: &[u8]) -> Result<String> {
    use std::collections::BTreeMap;
    use std::io::Read;
    let mut files = BTreeMap::new();
    let mut reader = tar::Archive::new(archive);
    for entry in reader.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.to_string_lossy().to_string();
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes)?;
        files.insert(path, bytes);
    }
    let blob = |descriptor: &Descriptor| -> Result<&Vec<u8>> {
        let hex = descriptor.digest().digest();
        let bytes = files
            .get(&format!("blobs/sha256/{hex}"))
            .with_context(|| format!("blob {} is missing", descriptor.digest()))?;
        anyhow::ensure!(
            sha256(bytes) == descriptor.digest().to_string(),
            "blob {} does not match its digest",
            descriptor.digest()
        );
        anyhow::ensure!(
            bytes.len() as u64 == descriptor.size(),
            "blob {} is not its size",
            descriptor.digest()
        );
        Ok(bytes)
    };
    anyhow::ensure!(files.contains_key("oci-layout"), "no oci-layout");
    let index: oci_spec::image::ImageIndex =
        serde_json::from_slice(files.get("index.json").context("no index.json")?)?;
    let [descriptor] = index.manifests().as_slice() else {
        anyhow::bail!(
            "the index names {} manifests, not one",
            index.manifests().len()
        );
    };
    let manifest: oci_spec::image::ImageManifest = serde_json::from_slice(blob(descriptor)?)?;
    let config: oci_spec::image::ImageConfiguration =
        serde_json::from_slice(blob(manifest.config())?)?;
    for layer in manifest.layers() {
        blob(layer)?;
    }
    anyhow::ensure!(
        config.rootfs().diff_ids().len() == manifest.layers().len(),
        "the configuration lists {} layers, the manifest {}",
        config.rootfs().diff_ids().len(),
        manifest.layers().len()
    );
    Ok(descriptor.digest().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BINARY: &[u8] = b"\x7fELF not really, but bytes all the same";

    #[test]
    fn the_same_input_gives_the_same_digest_and_archive() {
        let a = Image::new(BINARY, 1_764_400_000).unwrap();
        let b = Image::new(BINARY, 1_764_400_000).unwrap();
        assert_eq!(a.digest, b.digest);
        assert_eq!(
            a.archive("shaper:test").unwrap(),
            b.archive("shaper:test").unwrap()
        );
        // Another binary or another commit's time: another image.
        assert_ne!(
            a.digest,
            Image::new(b"other", 1_764_400_000).unwrap().digest
        );
        assert_ne!(a.digest, Image::new(BINARY, 1_764_400_001).unwrap().digest);
    }

    #[test]
    fn the_archive_reads_back_whole() {
        let image = Image::new(BINARY, 1_764_400_000).unwrap();
        let archive = image.archive("shaper:test").unwrap();
        assert_eq!(verify(&archive).unwrap(), image.digest);
        // The layer holds the binary where the entrypoint says, executable, root's.
        let mut layer = tar::Archive::new(flate2::read::GzDecoder::new(&image.layer.bytes[..]));
        let entries: Vec<(String, u32, u64, Vec<u8>)> = layer
            .entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let mut bytes = Vec::new();
                std::io::Read::read_to_end(&mut e, &mut bytes).unwrap();
                let h = e.header();
                (
                    e.path().unwrap().to_string_lossy().to_string(),
                    h.mode().unwrap(),
                    h.uid().unwrap(),
                    bytes,
                )
            })
            .collect();
        let names: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(names, ["usr/", "usr/local/", "usr/local/bin/", BINARY_PATH]);
        let binary = entries.last().unwrap();
        assert_eq!((binary.1, binary.2, &binary.3[..]), (0o755, 0, BINARY));
        let config: serde_json::Value = serde_json::from_slice(&image.config.bytes).unwrap();
        assert_eq!(config["config"]["Entrypoint"][0], "/usr/local/bin/shaper");
        assert_eq!(config["created"], "2025-11-29T07:06:40Z");
    }

    #[test]
    fn a_damaged_blob_is_found() {
        let image = Image::new(BINARY, 0).unwrap();
        let mut archive = image.archive("shaper:test").unwrap();
        let sample = &image.layer.bytes[10..42];
        let at = archive
            .windows(sample.len())
            .position(|w| w == sample)
            .unwrap();
        archive[at] ^= 0xff;
        assert!(verify(&archive).is_err());
    }

    #[test]
    fn dates_are_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_764_400_000), "2025-11-29T07:06:40Z");
    }
}
