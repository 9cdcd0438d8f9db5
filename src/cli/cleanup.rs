//! `dxdp cleanup --node NAME` / `--all`: takes off nodes what dxdp put on them (its labels, the
//! isolation taint, its node conditions), for an uninstall or after a crash. Runs anywhere with
//! Kubernetes credentials (KUBECONFIG, ~/.kube/config, or a pod's service account: the chart's
//! pre-delete hook runs `dxdp cleanup --all`).

use std::process::ExitCode;

use clap::Args;

use dxdp::cluster::Cluster;

/// Arguments of `dxdp cleanup`.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub(crate) struct CleanupArgs {
    /// The node to clean (repeat for more nodes).
    #[arg(long = "node", value_name = "NAME")]
    pub(crate) nodes: Vec<String>,
    /// Every node dxdp left something on (needs list on nodes).
    #[arg(long)]
    pub(crate) all: bool,
}

/// Cleans each node in turn; exit code 0 when all are clean, 1 when one could not be (or the
/// nodes could not be listed).
pub(crate) fn run(args: &CleanupArgs) -> anyhow::Result<ExitCode> {
    let runtime = super::runtime()?;
    let first = args.nodes.first().map_or("(all nodes)", String::as_str);
    let cluster = match runtime.block_on(Cluster::connect(Some(first))) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::FAILURE);
        }
    };
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
    let mut failed = 0;
    for node in &nodes {
        match runtime.block_on(cluster.for_node(node).cleanup()) {
            Ok(removed) => println!("{}", removed.describe(node)),
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
