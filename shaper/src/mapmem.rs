//! What the data path's per-host and per-flow maps hold and cost (`shaper stats --maps`).
//!
//! The maps are preallocated hash tables (LRU hashes always are; the host rates' plain hash is,
//! without `BPF_F_NO_PREALLOC`): their memory is fixed by `max-flows` and `max-hosts` when
//! shaper starts, whatever a flood puts in them. Per entry the kernel keeps a `struct
//! htab_elem` (48 bytes on 64-bit kernels: the bucket chain's node, the LRU node, the hash)
//! followed by the key and the value, each rounded up to 8 bytes, and one 16-byte bucket per
//! entry rounded up to a power of two (kernel/bpf/hashtab.c, 6.1 to 6.12). A plain hash
//! preallocates one spare element per possible CPU for updates in place.

use std::{
    io::BufRead,
    os::fd::{AsFd, AsRawFd},
};

use aya::maps::{HashMap, Map};
use serde::Serialize;
use shaper_common::{
    abi::{FlowKey, FlowState, HostRate, HostState},
    names::map_names,
};

use crate::bpf::{self, BpfError, MapReader};

/// `sizeof(struct htab_elem)` before the key, x86_64 and arm64.
pub const HTAB_ELEM_BYTES: u64 = 48;
/// `sizeof(struct bucket)`: the chain's head and its spinlock.
pub const BUCKET_BYTES: u64 = 16;

/// The kernel's bytes per element of a hash map with these key and value sizes.
pub fn element_bytes(key: u64, value: u64) -> u64 {
    HTAB_ELEM_BYTES + key.next_multiple_of(8) + value.next_multiple_of(8)
}

/// The kernel's bytes for a preallocated hash map's elements and buckets; `spares`: elements
/// beyond `max_entries` (a plain hash's one per possible CPU, an LRU hash's none).
pub fn map_bytes(key: u64, value: u64, max_entries: u64, spares: u64) -> u64 {
    element_bytes(key, value) * (max_entries + spares)
        + BUCKET_BYTES * max_entries.next_power_of_two()
}

/// Bytes per flow: its FLOWS element and its share of the buckets.
pub fn bytes_per_flow() -> u64 {
    element_bytes(size_of::<FlowKey>() as u64, size_of::<FlowState>() as u64) + BUCKET_BYTES
}

/// Bytes per host: its HOSTS element, its HOST_RATES element and their buckets.
pub fn bytes_per_host() -> u64 {
    let key = size_of::<FlowKey>() as u64;
    element_bytes(key, size_of::<HostState>() as u64)
        + element_bytes(key, size_of::<HostRate>() as u64)
        + 2 * BUCKET_BYTES
}

/// One map of a running instance.
#[derive(Debug, Serialize)]
pub struct MapUse {
    pub name: &'static str,
    pub entries: u64,
    pub max_entries: u32,
    pub key_bytes: u32,
    pub value_bytes: u32,
    /// What the layout above gives for the whole map.
    pub computed_bytes: u64,
    /// What the kernel charges for it (`memlock` in the map's fdinfo: on Linux ≥ 6.4 its own
    /// count of elements, buckets and LRU lists; before, only keys and values rounded to pages).
    pub memlock_bytes: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct MapsReport {
    pub maps: Vec<MapUse>,
    pub bytes_per_flow: u64,
    pub bytes_per_host: u64,
}

/// The per-host and per-flow maps of a running instance, with their entries counted (a walk
/// over the keys: a second or more for a million flows).
pub fn report(maps: &MapReader, possible_cpus: u64) -> Result<MapsReport, BpfError> {
    let maps = [
        (map_names::HOSTS, 0),
        (map_names::HOST_RATES, possible_cpus),
        (map_names::FLOWS, 0),
    ]
    .into_iter()
    .map(|(name, spares)| map_use(name, maps.table(name)?, spares))
    .collect::<Result<_, _>>()?;
    Ok(MapsReport {
        maps,
        bytes_per_flow: bytes_per_flow(),
        bytes_per_host: bytes_per_host(),
    })
}

fn map_use(name: &'static str, map: &Map, spares: u64) -> Result<MapUse, BpfError> {
    let err = |source| BpfError::Map { name, source };
    let data = bpf::map_data(map).ok_or(BpfError::Missing(name))?;
    let info = data.info().map_err(err)?;
    let memlock_bytes = memlock(data.fd().as_fd().as_raw_fd());
    let entries = count_keys(map).map_err(err)?;
    let (key, value) = (info.key_size(), info.value_size());
    Ok(MapUse {
        name,
        entries,
        max_entries: info.max_entries(),
        key_bytes: key,
        value_bytes: value,
        computed_bytes: map_bytes(key.into(), value.into(), info.max_entries().into(), spares),
        memlock_bytes,
    })
}

/// Keys counted through the map's value type (aya checks the value size).
fn count_keys(map: &Map) -> Result<u64, aya::maps::MapError> {
    macro_rules! walk {
        ($($v:ty),*) => {$(
            if let Ok(m) = HashMap::<_, FlowKey, $v>::try_from(map) {
                return Ok(m.keys().filter(Result::is_ok).count() as u64);
            }
        )*};
    }
    walk!(HostState, HostRate, FlowState);
    Err(aya::maps::MapError::InvalidValueSize {
        size: 0,
        expected: 0,
    })
}

/// The `memlock:` line of this process's fdinfo for `fd`.
fn memlock(fd: i32) -> Option<u64> {
    let file = std::fs::File::open(format!("/proc/self/fdinfo/{fd}")).ok()?;
    std::io::BufReader::new(file)
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("memlock:")?.trim().parse().ok())
}

impl MapsReport {
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "{:<18} {:>9} {:>9} {:>5} {:>6} {:>12} {:>12}\n",
            "map", "entries", "max", "key", "value", "computed B", "memlock B"
        );
        for m in &self.maps {
            s += &format!(
                "{:<18} {:>9} {:>9} {:>5} {:>6} {:>12} {:>12}\n",
                m.name,
                m.entries,
                m.max_entries,
                m.key_bytes,
                m.value_bytes,
                m.computed_bytes,
                m.memlock_bytes.map_or("-".into(), |b| b.to_string())
            );
        }
        s += &format!(
            "bytes per flow {}, per host {} (preallocated for max-flows and max-hosts)\n",
            self.bytes_per_flow, self.bytes_per_host
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_pinned() {
        // The data path's layouts (shaper-common): a change here changes the memory figures in
        // docs/notebook/reliability-memory.md.
        assert_eq!(size_of::<FlowKey>(), 40);
        assert_eq!(size_of::<FlowState>(), 104);
        assert_eq!(size_of::<HostState>(), 128);
        assert_eq!(size_of::<HostRate>(), 40);
        assert_eq!(bytes_per_flow(), 48 + 40 + 104 + 16);
        assert_eq!(bytes_per_host(), (48 + 40 + 128) + (48 + 40 + 40) + 32);
    }

    #[test]
    fn whole_maps() {
        // A million flows by default: 208 MiB, fixed when shaper starts.
        assert_eq!(map_bytes(40, 104, 1 << 20, 0), (1 << 20) * 208);
        // Buckets round up to a power of two; a plain hash has spares.
        assert_eq!(map_bytes(40, 40, 1000, 2), 128 * 1002 + 16 * 1024);
    }
}
