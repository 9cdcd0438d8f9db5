//! A device plugin whose device lists the test sends, for testing the kubelet stand-in itself:
//! it implements the plugin's one `DevicePlugin` server (`dxdp::plugin::answer::server`) and
//! counts its open `ListAndWatch` streams, so a test sees when the stand-in drops one.

use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use dxdp::kubelet::v1beta1::{
    AllocateRequest, Device, DevicePluginOptions, Empty, ListAndWatchResponse,
    PreStartContainerRequest, PreStartContainerResponse, PreferredAllocationRequest,
    PreferredAllocationResponse,
};
use dxdp::plugin::answer::server::device_plugin_server::{DevicePlugin, DevicePluginServer};
use dxdp::plugin::answer::AllocateAnswer;
use dxdp::transport::{Served, Transport};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// The fake plugin; `None` in its lists ends its streams.
struct Fake {
    lists: watch::Receiver<Option<Vec<Device>>>,
    open: Arc<watch::Sender<usize>>,
}

/// Counts one open stream until dropped.
struct Open(Arc<watch::Sender<usize>>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

type Lists = Pin<Box<dyn tokio_stream::Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for Fake {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(DevicePluginOptions::default()))
    }

    type ListAndWatchStream = Lists;

    async fn list_and_watch(&self, _: Request<Empty>) -> Result<Response<Lists>, Status> {
        let mut lists = self.lists.clone();
        self.open.send_modify(|n| *n += 1);
        let open = Open(self.open.clone());
        Ok(Response::new(Box::pin(async_stream::stream! {
            let _open = open;
            loop {
                let Some(devices) = lists.borrow_and_update().clone() else {
                    break;
                };
                yield Ok(ListAndWatchResponse { devices });
                if lists.changed().await.is_err() {
                    break;
                }
            }
        })))
    }

    async fn get_preferred_allocation(
        &self,
        _: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn allocate(
        &self,
        _: Request<AllocateRequest>,
    ) -> Result<Response<AllocateAnswer>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
}

/// A fake plugin on `<dir>/<endpoint>`: the server, the sender of its lists and the count of its
/// open streams.
pub fn fake(
    transport: Transport,
    dir: &Path,
    endpoint: &str,
) -> (
    Served,
    watch::Sender<Option<Vec<Device>>>,
    watch::Receiver<usize>,
) {
    let (lists_tx, lists) = watch::channel(None);
    let (open, open_rx) = watch::channel(0);
    let open = Arc::new(open);
    let listener = transport
        .bind(&dir.join(endpoint))
        .expect("bind the fake plugin's socket");
    let served = Served::spawn(
        listener,
        tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(Fake { lists, open })),
    );
    (served, lists_tx, open_rx)
}
