//! `dxdp mounts`: the flags that give a standalone container the selected devices and their
//! runtime files, in the syntax of ctr, nerdctl or docker, or as JSON or an OCI spec fragment.
//! The devices and mounts are exactly what the plugin's `Allocate` returns for them.

use serde_json::json;

use super::shell::{self, Shell};
use crate::output::{ApiVersion, Mount, MountsDevice, MountsDoc, MountsKind};
use dxdp_core::allocation::{container_edits, ContainerEdits, DISPLAY_CLASS_DEVICE};
use dxdp_core::assignment::Assignment;
use dxdp_core::devices::Device;

/// The display-adapter device interface class that Docker and the older plugins assign.
pub(crate) const DISPLAY_CLASS_GUID: &str = "5B45201D-F2F2-4F3B-85BB-30FF1F953599";

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `ctr run` flags.
    Ctr,
    /// `nerdctl run` flags.
    Nerdctl,
    /// `docker run` flags (class GUID; no single-file mounts).
    Docker,
    /// `{"apiVersion", "kind": "Mounts", "devices", "mounts", "containerDevices"}`.
    Json,
    /// The same document as YAML.
    Yaml,
    /// The `windows.devices` and `mounts` fragment of an OCI runtime spec.
    Oci,
}

/// What `dxdp mounts` prints: the text for stdout and notes for stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    /// The flags or document.
    pub text: String,
    /// Things the user must know (stderr).
    pub notes: Vec<String>,
}

/// `--device` per device and `--mount <spec(host, container)>` per runtime file.
fn device_and_mount_args(
    edits: &ContainerEdits,
    mount: impl Fn(&str, &str) -> String,
) -> Vec<String> {
    let devices = edits
        .devices
        .iter()
        .flat_map(|d| ["--device".to_string(), d.clone()]);
    let mounts = edits.mounts.iter().flat_map(|m| {
        [
            "--mount".to_string(),
            mount(&m.host_path, &m.container_path),
        ]
    });
    devices.chain(mounts).collect()
}

/// `ctr run` arguments for the devices: `--device` per device, `--mount` per runtime file.
pub fn ctr_args(edits: &ContainerEdits) -> Vec<String> {
    device_and_mount_args(edits, |src, dst| {
        format!("type=bind,src={src},dst={dst},options=rbind:ro")
    })
}

fn nerdctl_args(edits: &ContainerEdits) -> Vec<String> {
    device_and_mount_args(edits, |src, dst| {
        format!("type=bind,source={src},target={dst},readonly")
    })
}

/// Renders the selected devices in `format`, quoting for `shell` where the format is flags.
pub fn render(devices: &[&Device], format: Format, shell: Shell) -> Rendered {
    render_with(devices, format, shell, Assignment::LocationPath)
}

/// As [`render`], for an assignment mode: class-guid gives the display-adapter class instead of
/// the devices' location paths (every GPU of the host).
pub fn render_with(
    devices: &[&Device],
    format: Format,
    shell: Shell,
    assignment: Assignment,
) -> Rendered {
    let mut edits = container_edits(devices);
    let mut notes = edits.notes.clone();
    if assignment == Assignment::ClassGuid && format != Format::Docker {
        edits.devices = vec![DISPLAY_CLASS_DEVICE.to_string()];
        notes.push("assignment class-guid: the container gets every display adapter of the host, not only the selected devices".into());
    }
    let missing: usize = devices
        .iter()
        .map(|d| d.runtime_files.iter().filter(|(_, f)| !f.exists).count())
        .sum();
    if missing > 0 {
        notes.push(format!(
            "{missing} runtime file(s) listed by the driver do not exist on the host and are not mounted (see `dxdp discover`)"
        ));
    }
    let text = match format {
        Format::Ctr => shell::join(&ctr_args(&edits), shell) + "\n",
        Format::Nerdctl => shell::join(&nerdctl_args(&edits), shell) + "\n",
        Format::Docker => {
            notes.push(
                "Docker uses HCS v1, which cannot bind-mount single files: the runtime files (CUDA, OpenCL, Vulkan, ...) are not mounted, so only DirectX works in the container"
                    .into(),
            );
            notes.push(format!(
                "--device class/{DISPLAY_CLASS_GUID} gives the container every GPU of the host, not only the selected ones"
            ));
            let args = vec![
                "--isolation".to_string(),
                "process".to_string(),
                "--device".to_string(),
                format!("class/{DISPLAY_CLASS_GUID}"),
            ];
            shell::join(&args, shell) + "\n"
        }
        Format::Json | Format::Yaml => {
            let doc = MountsDoc {
                api_version: ApiVersion,
                kind: MountsKind,
                devices: devices
                    .iter()
                    .map(|d| MountsDevice {
                        id: d.id.clone(),
                        description: d.description.clone(),
                        location_path: d.location_path.clone(),
                        host_path: d.host_path(),
                    })
                    .collect(),
                mounts: edits
                    .mounts
                    .iter()
                    .map(|m| Mount {
                        source: m.host_path.clone(),
                        destination: m.container_path.clone(),
                        read_only: true,
                    })
                    .collect(),
                container_devices: edits.devices.clone(),
            };
            if format == Format::Yaml {
                // Plain strings and booleans: serialising cannot fail.
                crate::output::to_yaml(&doc).unwrap_or_default()
            } else {
                crate::output::to_json(&doc)
            }
        }
        Format::Oci => {
            let doc = json!({
                "windows": {
                    "devices": edits.devices.iter().map(|d| {
                        let (id_type, id) = d.split_once("://").or_else(|| d.split_once('/')).unwrap_or(("", d));
                        json!({"idType": id_type, "id": id})
                    }).collect::<Vec<_>>(),
                },
                "mounts": edits.mounts.iter().map(|m| json!({
                    "destination": m.container_path,
                    "source": m.host_path,
                    "options": ["ro"],
                })).collect::<Vec<_>>(),
            });
            serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n"
        }
    };
    Rendered { text, notes }
}
