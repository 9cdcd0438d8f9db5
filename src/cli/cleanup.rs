//! `dxdp cleanup --node NAME` / `--all`: takes off nodes what dxdp put on them (its labels, the
//! isolation taint, its node conditions), for an uninstall or after a crash; given dxdp's
//! namespace, first its DaemonSet (`--daemonset`: deleted, and waited for until its pods are
//! gone, so that no running dxdp puts its labels back), the validation Jobs there and the
//! NodeFeature objects of `nodeLabels.mode: nodefeature` (dxdp-<node>). Runs
//! anywhere with Kubernetes credentials (KUBECONFIG, ~/.kube/config, `--context`, or a pod's
//! service account: the chart's pre-delete hook runs `dxdp cleanup --all --namespace NS
//! --daemonset NAME`). `--dry-run` says what it would do and changes nothing.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use dxdp::cluster::Cluster;

/// How often the DaemonSet is read while its pods stop.
const POLL: Duration = Duration::from_secs(1);

/// Arguments of `dxdp cleanup`.
#[derive(Debug, Args)]
pub(crate) struct CleanupArgs {
    /// The node to clean (repeat for more nodes).
    #[arg(long = "node", value_name = "NAME")]
    pub(crate) nodes: Vec<String>,
    /// Every node dxdp left something on (needs list on nodes).
    #[arg(long, conflicts_with = "nodes", required_unless_present = "nodes")]
    pub(crate) all: bool,
    /// dxdp's namespace: its validation Jobs and NodeFeature objects there are deleted (with
    /// `--node`, those of the nodes named), and `--daemonset` is looked for there.
    #[arg(short = 'n', long, value_name = "NAMESPACE")]
    pub(crate) namespace: Option<String>,
    /// dxdp's DaemonSet: deleted first, and waited for until its pods are gone (at most
    /// `--wait`), so that no running dxdp puts back what the cleanup removes.
    #[arg(long, value_name = "NAME", requires = "namespace")]
    pub(crate) daemonset: Option<String>,
    /// How long to wait for the DaemonSet's pods to go, in seconds; then the nodes are cleaned
    /// anyway, with a warning.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 60,
        requires = "daemonset"
    )]
    pub(crate) wait: u64,
    /// Say what would be removed (the DaemonSet, the Jobs, per node), change nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// The kubeconfig context to use (as kubectl's `--context`).
    #[arg(long, value_name = "NAME")]
    pub(crate) context: Option<String>,
}

/// Stops the DaemonSet, deletes the validation Jobs, then cleans each node in turn; exit code
/// 0 when all is done, 1 when a part could not be (each error names it and what to grant).
pub(crate) fn run(args: &CleanupArgs) -> anyhow::Result<ExitCode> {
    let runtime = super::runtime()?;
    let cluster = match runtime.block_on(Cluster::connect_for_cleanup(args.context.as_deref())) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let dry = args.dry_run;
    let mut failed = 0;
    if let (Some(ns), Some(name)) = (&args.namespace, &args.daemonset) {
        let wait = Duration::from_secs(args.wait);
        match runtime.block_on(cluster.stop_daemonset(ns, name, wait, POLL, dry)) {
            Ok(stopped) if stopped.is_warning() => {
                eprintln!("warning: {}", stopped.describe(ns, name, wait))
            }
            Ok(stopped) => println!("{}", stopped.describe(ns, name, wait)),
            Err(e) => {
                // Cleaned anyway: what can be removed is, but a running dxdp may put it back.
                failed += 1;
                eprintln!(
                    "error: {e}; cleaning anyway, but a dxdp that still runs puts its labels back"
                );
            }
        }
    }
    if let Some(ns) = &args.namespace {
        let only = (!args.all).then_some(args.nodes.as_slice());
        let jobs = runtime.block_on(async {
            let names = cluster.validation_jobs_to_clean(ns, only).await?;
            if !dry {
                cluster.delete_jobs(ns, &names).await?;
            }
            Ok::<_, String>(names)
        });
        match jobs {
            Ok(names) if names.is_empty() => println!("validation jobs in {ns}: none"),
            Ok(names) => println!(
                "validation jobs in {ns}: {} {} ({})",
                if dry { "would delete" } else { "deleted" },
                names.len(),
                names.join(", ")
            ),
            Err(e) => {
                failed += 1;
                eprintln!("error: {e}");
            }
        }
        let objects = runtime.block_on(async {
            let names = cluster.node_features_to_clean(ns, only).await?;
            if !dry {
                cluster.delete_node_features(ns, &names).await?;
            }
            Ok::<_, String>(names)
        });
        match objects {
            Ok(names) if names.is_empty() => println!("NodeFeature objects in {ns}: none"),
            Ok(names) => println!(
                "NodeFeature objects in {ns}: {} {} ({})",
                if dry { "would delete" } else { "deleted" },
                names.len(),
                names.join(", ")
            ),
            Err(e) => {
                failed += 1;
                eprintln!("error: {e}");
            }
        }
    }
    let nodes = if args.all {
        match runtime.block_on(cluster.nodes_with_dxdp_state()) {
            Ok(nodes) => {
                if nodes.is_empty() {
                    println!("no node has labels, taints or conditions of dxdp's");
                }
                nodes
            }
            Err(e) => {
                eprintln!("error: {e}");
                return Ok(ExitCode::FAILURE);
            }
        }
    } else {
        args.nodes.clone()
    };
    for node in &nodes {
        let one = cluster.for_node(node);
        let outcome = if dry {
            runtime
                .block_on(one.cleanup_plan())
                .map(|p| p.describe_planned(node))
        } else {
            runtime.block_on(one.cleanup()).map(|r| r.describe(node))
        };
        match outcome {
            Ok(line) => println!("{line}"),
            Err(e) => {
                failed += 1;
                eprintln!("error: node {node}: {e}");
            }
        }
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
