//! Data paths loaded ahead of need. Loading the BPF object (creating its maps, the LRU ones
//! preallocated, and verifying its programs) is most of an interface's start: seconds under
//! emulation, against milliseconds for the qdisc and the attach. A run whose interfaces come
//! and go (`[[interface]]` sections) keeps one data path loaded, on a thread of its own, for
//! each map sizing its interfaces use, so that an interface that appears or comes back is
//! shaped in the time the rest takes.
//!
//! A spare is a freshly loaded, unconfigured data path: nothing of another interface's is in
//! its maps. The price is its memory, one more data path per sizing (`shaper doctor` and
//! docs/design.md give a data path's size for the settings).

use std::{collections::HashMap, thread::JoinHandle};

use tracing::{debug, warn};

use crate::{
    bpf::{BpfError, Datapath},
    config::StateParams,
};

#[derive(Default)]
pub struct Spares {
    loading: HashMap<StateParams, JoinHandle<Result<Datapath, BpfError>>>,
}

impl Spares {
    /// A data path for `state`: the spare (waiting for it if it is still loading), or one
    /// loaded now; another spare is started either way.
    pub fn take(&mut self, state: &StateParams) -> Result<Datapath, BpfError> {
        let spare = self
            .loading
            .remove(state)
            .and_then(|handle| match handle.join() {
                Ok(Ok(datapath)) => Some(datapath),
                Ok(Err(e)) => {
                    warn!("loading a spare data path: {e}");
                    None
                }
                Err(_) => None,
            });
        let datapath = match spare {
            Some(datapath) => Ok(datapath),
            None => load(state),
        };
        self.prepare(state);
        datapath
    }

    /// Starts loading a spare for `state` unless one is there or loading.
    pub fn prepare(&mut self, state: &StateParams) {
        let state = *state;
        self.loading
            .entry(state)
            .or_insert_with(|| std::thread::spawn(move || load(&state)));
    }

    /// Drops the spares of sizings no interface uses any more (one still loading is dropped
    /// when it is done).
    pub fn keep_only(&mut self, used: &[StateParams]) {
        self.loading.retain(|state, _| used.contains(state));
    }
}

/// A data path loaded with its dequeue observer verified (shaping goes on without the observer
/// when it cannot be had: `watch_dequeue` says so when the interface is shaped).
fn load(state: &StateParams) -> Result<Datapath, BpfError> {
    let mut datapath = Datapath::load(state)?;
    if let Err(e) = datapath.prepare_dequeue() {
        debug!("preparing the dequeue observer ahead: {e}");
    }
    Ok(datapath)
}
