//! Which configuration files to read, also inside a HostProcess container on containerd 1.6
//! (where the chart's ConfigMap is under the sandbox mount point: `util::host_process`).

use std::path::{Path, PathBuf};

use dxdp::config::Env;
use dxdp::util::host_process::resolve;

/// The environment variables that name configuration files.
const FILE_VARS: [&str; 3] = [
    "DXDP_CONFIG",
    "WDDM_DEVICE_PLUGIN_CONFIG_FILE",
    "MCDM_DEVICE_PLUGIN_CONFIG_FILE",
];

/// Resolves the configuration file choice and the file-naming variables in `env` against the
/// sandbox mount point. `default` is the default configuration path, used (not required) when
/// no file was chosen and it exists under the sandbox.
pub fn resolve_inputs(
    file: Option<(PathBuf, bool)>,
    env: &mut Env,
    default: &Path,
    sandbox: Option<&str>,
    exists: impl Fn(&Path) -> bool,
) -> Option<(PathBuf, bool)> {
    for var in FILE_VARS {
        if let Some(value) = env.get_mut(var).filter(|v| !v.is_empty()) {
            *value = resolve(Path::new(value.as_str()), sandbox, &exists)
                .to_string_lossy()
                .into_owned();
        }
    }
    match file {
        Some((path, required)) => Some((resolve(&path, sandbox, &exists), required)),
        None => {
            let found = resolve(default, sandbox, &exists);
            (found != default && exists(&found)).then_some((found, false))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    const SANDBOX: &str = r"C:\C\0f3a";

    fn fs(files: &[&str]) -> impl Fn(&Path) -> bool {
        let set: BTreeSet<String> = files.iter().map(|s| s.to_string()).collect();
        move |p: &Path| set.contains(p.to_string_lossy().as_ref())
    }

    #[test]
    fn resolves_the_file_and_the_reference_variables() {
        let exists = fs(&[
            r"C:\C\0f3a\etc\dxdp\config.yaml",
            r"C:\C\0f3a\ref\wddm.yaml",
        ]);
        let mut env = Env::new();
        env.insert("DXDP_CONFIG".into(), r"C:\etc\dxdp\config.yaml".into());
        env.insert(
            "WDDM_DEVICE_PLUGIN_CONFIG_FILE".into(),
            r"C:\ref\wddm.yaml".into(),
        );
        env.insert("MCDM_DEVICE_PLUGIN_CONFIG_FILE".into(), String::new());
        env.insert("DXDP_REPLICAS".into(), r"C:\ref\wddm.yaml".into());
        let file = Some((PathBuf::from(r"C:\etc\dxdp\config.yaml"), true));
        let got = resolve_inputs(file, &mut env, Path::new(r"C:\d"), Some(SANDBOX), &exists);
        assert_eq!(
            got,
            Some((PathBuf::from(r"C:\C\0f3a\etc\dxdp\config.yaml"), true))
        );
        assert_eq!(env["DXDP_CONFIG"], r"C:\C\0f3a\etc\dxdp\config.yaml");
        assert_eq!(
            env["WDDM_DEVICE_PLUGIN_CONFIG_FILE"],
            r"C:\C\0f3a\ref\wddm.yaml"
        );
        assert_eq!(env["MCDM_DEVICE_PLUGIN_CONFIG_FILE"], "");
        assert_eq!(
            env["DXDP_REPLICAS"], r"C:\ref\wddm.yaml",
            "not a file variable"
        );
    }

    #[test]
    fn the_default_file_under_the_sandbox_is_optional() {
        let default = Path::new(r"C:\etc\directx-device-plugins\config.yaml");
        let mut env = Env::new();
        let exists = fs(&[r"C:\C\0f3a\etc\directx-device-plugins\config.yaml"]);
        assert_eq!(
            resolve_inputs(None, &mut env, default, Some(SANDBOX), &exists),
            Some((
                PathBuf::from(r"C:\C\0f3a\etc\directx-device-plugins\config.yaml"),
                false
            ))
        );
        assert_eq!(
            resolve_inputs(None, &mut env, default, Some(SANDBOX), fs(&[])),
            None
        );
        assert_eq!(resolve_inputs(None, &mut env, default, None, &exists), None);
    }
}
