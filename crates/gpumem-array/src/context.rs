//! [`DeviceContext`]: the pool and stream that arrays allocate from and order their work on.

use std::sync::Arc;

use gpumem_device::{Device, StreamId};
use gpumem_pool::Pool;

/// Where arrays live and in what order their work runs: a [`Pool`] (on any backend) and the
/// stream that allocations, copies and frees are ordered on. Cheap to clone; every array
/// keeps a clone, so the pool outlives its arrays.
#[derive(Clone)]
pub struct DeviceContext {
    pool: Arc<Pool>,
    stream: StreamId,
}

impl DeviceContext {
    /// Arrays from `pool`, ordered on the default stream.
    pub fn new(pool: Arc<Pool>) -> Self {
        DeviceContext {
            pool,
            stream: StreamId::DEFAULT,
        }
    }

    /// The same pool, with work ordered on `stream` instead.
    pub fn on_stream(&self, stream: StreamId) -> Self {
        DeviceContext {
            pool: self.pool.clone(),
            stream,
        }
    }

    /// The pool arrays allocate from.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// The device under the pool.
    pub fn device(&self) -> &dyn Device {
        self.pool.device().as_ref()
    }

    /// The stream work is ordered on.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// Whether `other` allocates from the same device (copies between their arrays are
    /// possible).
    pub fn same_device(&self, other: &DeviceContext) -> bool {
        Arc::ptr_eq(self.pool.device(), other.pool.device())
    }

    /// Makes work issued to `after` from now on wait for the work issued to `before` so far
    /// (an event recorded on `before`; nothing when they are the same stream).
    pub(crate) fn order_streams(
        &self,
        before: StreamId,
        after: StreamId,
    ) -> Result<(), gpumem_device::DeviceError> {
        if before == after {
            return Ok(());
        }
        let device = self.device();
        let event = device.record_event(before)?;
        let waited = device.stream_wait_event(after, event);
        device.destroy_event(event)?;
        waited
    }

    /// A number that identifies the device while any array of it lives (its address).
    pub(crate) fn device_key(&self) -> usize {
        Arc::as_ptr(self.pool.device()) as *const () as usize
    }
}

impl std::fmt::Debug for DeviceContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceContext")
            .field("device", &self.device().name())
            .field("policy", &self.pool.policy_name())
            .field("stream", &self.stream)
            .finish()
    }
}
