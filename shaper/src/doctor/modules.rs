//! Whether the running kernel has a piece as a module, built in, or not at all, from its own
//! lists: `/proc/modules` (loaded), and `modules.builtin` and `modules.dep` under
//! `/lib/modules/<release>` (built in, loadable). A kernel without module support has neither
//! file; a system that keeps its modules elsewhere (an initramfs, a container) lacks the
//! second two. What the lists cannot tell is [`ModuleState::Unknown`], not absent.

use std::collections::HashSet;

/// What the module lists say about one module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModuleState {
    Loaded,
    BuiltIn,
    /// A module on disk, not loaded: the kernel loads it on first use.
    Loadable,
    /// The lists were read and name it nowhere.
    Absent,
    /// No list says, and the lists that could say absent are missing.
    Unknown,
}

impl ModuleState {
    /// The kernel has it, or will load it when asked.
    pub fn is_available(self) -> bool {
        matches!(self, Self::Loaded | Self::BuiltIn | Self::Loadable)
    }
}

/// The kernel's module lists, each `None` when its file could not be read.
#[derive(Debug, Clone, Default)]
pub struct ModuleLists {
    loaded: Option<HashSet<String>>,
    builtin: Option<HashSet<String>>,
    loadable: Option<HashSet<String>>,
}

impl ModuleLists {
    /// From the texts of `/proc/modules`, `modules.builtin` and `modules.dep`.
    pub fn parse(proc_modules: Option<&str>, builtin: Option<&str>, dep: Option<&str>) -> Self {
        let names = |text: &str, field: fn(&str) -> Option<&str>| -> HashSet<String> {
            text.lines().filter_map(field).map(module_name).collect()
        };
        Self {
            // "sch_fq 98304 0 - Live 0x0000000000000000"
            loaded: proc_modules.map(|t| names(t, |l| l.split_whitespace().next())),
            // "kernel/net/sched/sch_fq.ko"
            builtin: builtin.map(|t| names(t, |l| Some(l.trim()).filter(|l| !l.is_empty()))),
            // "kernel/net/sched/sch_fq.ko.xz: kernel/net/sched/sch_api.ko.xz"
            loadable: dep.map(|t| names(t, |l| l.split(':').next().filter(|p| !p.is_empty()))),
        }
    }

    /// The running kernel's.
    pub fn read() -> Self {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        let release = read("/proc/sys/kernel/osrelease").unwrap_or_default();
        let dir = format!("/lib/modules/{}", release.trim());
        Self::parse(
            read("/proc/modules").as_deref(),
            read(&format!("{dir}/modules.builtin")).as_deref(),
            read(&format!("{dir}/modules.dep")).as_deref(),
        )
    }

    pub fn state(&self, module: &str) -> ModuleState {
        let name = module_name(module);
        let has = |list: &Option<HashSet<String>>| list.as_ref().is_some_and(|l| l.contains(&name));
        if has(&self.loaded) {
            ModuleState::Loaded
        } else if has(&self.builtin) {
            ModuleState::BuiltIn
        } else if has(&self.loadable) {
            ModuleState::Loadable
        } else if self.builtin.is_some() && self.loadable.is_some() {
            ModuleState::Absent
        } else {
            ModuleState::Unknown
        }
    }
}

/// A module's name from a list entry: the file name without directories and without `.ko`
/// and any compression suffix, `-` read as `_` (the kernel treats them alike).
fn module_name(entry: &str) -> String {
    let file = entry.rsplit('/').next().unwrap_or(entry);
    let stem = file.split(".ko").next().unwrap_or(file);
    stem.replace('-', "_")
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROC_MODULES: &str = "sch_fq 98304 2 - Live 0x0000000000000000\n\
                                tcp_bbr 20480 3 - Live 0x0000000000000000\n";
    const BUILTIN: &str = "kernel/net/sched/sch_ingress.ko\nkernel/drivers/net/ifb.ko\n";
    const DEP: &str = "kernel/net/sched/sch_fq.ko.xz:\n\
                       kernel/net/sched/cls_matchall.ko.zst: kernel/net/sched/sch_api.ko.zst\n\
                       kernel/net/sched/act-mirred.ko:\n";

    #[test]
    fn each_list_says_its_own_state_and_loaded_wins() {
        let lists = ModuleLists::parse(Some(PROC_MODULES), Some(BUILTIN), Some(DEP));
        assert_eq!(lists.state("sch_fq"), ModuleState::Loaded);
        assert_eq!(lists.state("tcp_bbr"), ModuleState::Loaded);
        assert_eq!(lists.state("sch_ingress"), ModuleState::BuiltIn);
        assert_eq!(lists.state("ifb"), ModuleState::BuiltIn);
        assert_eq!(lists.state("cls_matchall"), ModuleState::Loadable);
        assert_eq!(lists.state("cls_bpf"), ModuleState::Absent);
    }

    #[test]
    fn dashes_and_underscores_name_the_same_module() {
        let lists = ModuleLists::parse(None, Some(""), Some(DEP));
        assert_eq!(lists.state("act_mirred"), ModuleState::Loadable);
        assert_eq!(lists.state("act-mirred"), ModuleState::Loadable);
    }

    #[test]
    fn without_the_on_disk_lists_nothing_is_called_absent() {
        // A kernel without modules: no /proc/modules, no /lib/modules.
        let none = ModuleLists::parse(None, None, None);
        assert_eq!(none.state("sch_fq"), ModuleState::Unknown);
        // Modules loaded from an initramfs, the lists not installed.
        let loaded_only = ModuleLists::parse(Some(PROC_MODULES), None, None);
        assert_eq!(loaded_only.state("sch_fq"), ModuleState::Loaded);
        assert_eq!(loaded_only.state("cls_bpf"), ModuleState::Unknown);
        // Half the lists still cannot tell absent from built in.
        let no_builtin = ModuleLists::parse(None, None, Some(DEP));
        assert_eq!(no_builtin.state("sch_ingress"), ModuleState::Unknown);
    }

    #[test]
    fn blank_and_malformed_lines_name_nothing() {
        let lists = ModuleLists::parse(Some("\n"), Some("\n\n"), Some(":\n\n"));
        assert_eq!(lists.state(""), ModuleState::Absent);
        assert_eq!(lists.state("sch_fq"), ModuleState::Absent);
        assert!(!ModuleState::Absent.is_available());
        assert!(!ModuleState::Unknown.is_available());
        assert!(ModuleState::Loadable.is_available());
    }
}
