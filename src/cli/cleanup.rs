//! `dxdp cleanup --node NAME`: takes off the named nodes what dxdp put on them (its labels, the
//! isolation taint, its node conditions), for an uninstall or after a crash. Runs anywhere with
//! Kubernetes credentials (KUBECONFIG, ~/.kube/config, or a pod's service account).

use std::process::ExitCode;

use clap::Args;

use dxdp::cluster::Cluster;

/// Arguments of `dxdp cleanup`.
#[derive(Debug, Args)]
pub struct CleanupArgs {
    /// The node to clean (repeat for more nodes).
    #[arg(long = "node", value_name = "NAME", required = true)]
    pub nodes: Vec<String>,
}

/// Cleans each node in turn; exit code 0 when all are clean, 1 when one could not be.
pub fn run(args: &CleanupArgs) -> anyhow::Result<ExitCode> {
    let runtime = super::runtime()?;
    let mut failed = 0;
    for node in &args.nodes {
        let result = runtime.block_on(async {
            let cluster = Cluster::connect(Some(node))
                .await
                .map_err(|e| e.to_string())?;
            cluster.cleanup().await
        });
        match result {
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
