//! Structure-preserving upload and download: [`ToDevice`] turns a value holding host arrays
//! into the same structure of device arrays, [`ToHost`] turns it back. Implemented for the
//! array types, `Vec`, `Option` and tuples of them, and for your own structs with
//! `#[derive(ToDevice)]`.

use bytemuck::Pod;
use gpumem_device::{Device, DevicePtr, EventId, InFlight, PinnedBuffer, StreamId};

use crate::shape::check_data_len;
use crate::{ArrayError, DeviceArray, DeviceContext, DeviceRead, HostArray, PinnedHostArray};

/// A value whose host arrays can be uploaded, giving the same structure of device arrays
/// ([`ToDevice::Device`]). Upload with [`upload`], or in batches with
/// [`DeviceContext::batches`].
///
/// `#[derive(ToDevice)]` implements it for a struct whose fields implement it, and makes the
/// twin struct of device arrays (named `<Struct>OnDevice` unless
/// `#[gpumem(device = "Name")]` says otherwise), with [`ToHost`] back to the struct (unless
/// `#[gpumem(upload_only)]`, for fields such as [`PinnedHostArray`] that download to another
/// type).
pub trait ToDevice {
    /// The same structure with device arrays in place of host arrays.
    type Device;

    /// Uploads every array through `uploader`, which decides how (see [`Uploader`]).
    fn upload_with(&self, uploader: &mut Uploader<'_, '_>) -> Result<Self::Device, ArrayError>;
}

/// A value holding device arrays that can be downloaded into the same structure of host
/// arrays ([`ToHost::Host`]).
pub trait ToHost {
    /// The same structure with host arrays in place of device arrays.
    type Host;

    /// Downloads every array (synchronously, on each array's stream).
    fn to_host(&self) -> Result<Self::Host, ArrayError>;
}

/// Uploads `value`'s arrays with synchronous copies, in `context`.
pub fn upload<X: ToDevice + ?Sized>(
    context: &DeviceContext,
    value: &X,
) -> Result<X::Device, ArrayError> {
    value.upload_with(&mut Uploader {
        context,
        staging: None,
    })
}

/// How [`ToDevice::upload_with`] moves arrays: with synchronous copies ([`upload`]), or, in
/// the batch iterator, with asynchronous copies on a copy stream from reused pinned staging.
/// Either way the device arrays belong to the uploader's context and stream.
pub struct Uploader<'a, 'd> {
    context: &'a DeviceContext,
    staging: Option<&'a mut Staging<'d>>,
}

impl<'a, 'd> Uploader<'a, 'd> {
    /// An uploader that stages through `staging` (the batch iterator's).
    pub(crate) fn staged(context: &'a DeviceContext, staging: &'a mut Staging<'d>) -> Self {
        Uploader {
            context,
            staging: Some(staging),
        }
    }

    /// Uploads `data` as an array of `shape` (the one operation every [`ToDevice`] comes
    /// down to).
    pub fn upload_array<T: Pod>(
        &mut self,
        shape: &[usize],
        data: &[T],
    ) -> Result<DeviceArray<T>, ArrayError> {
        let Some(staging) = self.staging.as_deref_mut() else {
            return DeviceArray::from_shape(self.context, shape, data);
        };
        check_data_len::<T>(shape, data.len())?;
        let array = DeviceArray::empty(self.context, shape)?;
        let bytes: &[u8] = bytemuck::cast_slice(data);
        if !bytes.is_empty() {
            staging.upload(array.device_ptr(), bytes)?;
        }
        Ok(array)
    }
}

/// Pinned host buffers and the asynchronous uploads that use them, for the batch iterator.
pub(crate) struct Staging<'d> {
    device: &'d dyn Device,
    copy_stream: StreamId,
    /// Buffers no copy uses any more, for reuse (a copy takes a whole buffer, so they are
    /// reused by exact length).
    spare: Vec<PinnedBuffer>,
    /// Copies issued since [`Staging::finish_batch`] last took them.
    in_flight: Vec<InFlight<'d, PinnedBuffer>>,
}

/// The most spare staging buffers kept: batches of varying shapes do not hoard host memory.
const MAX_SPARE_BUFFERS: usize = 64;

impl<'d> Staging<'d> {
    pub(crate) fn new(device: &'d dyn Device, copy_stream: StreamId) -> Self {
        Staging {
            device,
            copy_stream,
            spare: Vec::new(),
            in_flight: Vec::new(),
        }
    }

    /// Orders the copy stream after the work issued to `context`'s stream so far: the memory
    /// a batch is uploaded into may have been freed by that work.
    pub(crate) fn begin_batch(&mut self, context: &DeviceContext) -> Result<(), ArrayError> {
        Ok(context.order_streams(context.stream(), self.copy_stream)?)
    }

    /// Records the event that completes with the copies issued since
    /// [`Staging::begin_batch`], and hands over those copies (their buffers come back once
    /// they completed). The caller orders the consumer's stream after the event when it hands
    /// the batch out ([`Staging::hand_over`]).
    pub(crate) fn finish_batch(
        &mut self,
    ) -> Result<(EventId, Vec<InFlight<'d, PinnedBuffer>>), ArrayError> {
        let copies = std::mem::take(&mut self.in_flight);
        // On an error the copies are dropped, which waits for them.
        let uploaded = self.device.record_event(self.copy_stream)?;
        Ok((uploaded, copies))
    }

    /// Makes work issued to `stream` from now on wait for `uploaded` (from
    /// [`Staging::finish_batch`]), and destroys the event.
    pub(crate) fn hand_over(&self, uploaded: EventId, stream: StreamId) -> Result<(), ArrayError> {
        let waited = self.device.stream_wait_event(stream, uploaded);
        self.device.destroy_event(uploaded)?;
        Ok(waited?)
    }

    /// Gives up a batch's upload: waits for its copies and destroys its event.
    pub(crate) fn discard(
        &self,
        uploaded: EventId,
        copies: Vec<InFlight<'d, PinnedBuffer>>,
    ) -> Result<(), ArrayError> {
        drop(copies);
        Ok(self.device.destroy_event(uploaded)?)
    }

    /// Waits for copies handed over by [`Staging::finish_batch`] and keeps their buffers.
    pub(crate) fn recycle(
        &mut self,
        copies: Vec<InFlight<'d, PinnedBuffer>>,
    ) -> Result<(), ArrayError> {
        for copy in copies {
            let buffer = copy.wait()?;
            if self.spare.len() == MAX_SPARE_BUFFERS {
                self.spare.remove(0);
            }
            self.spare.push(buffer);
        }
        Ok(())
    }

    /// Waits for `copies` and destroys the copy stream: the end of the staging.
    pub(crate) fn finish(
        &mut self,
        copies: Vec<InFlight<'d, PinnedBuffer>>,
    ) -> Result<(), ArrayError> {
        drop(copies);
        self.in_flight.clear();
        if self.copy_stream == StreamId::DEFAULT {
            return Ok(()); // a device with one queue gave its only stream
        }
        Ok(self.device.destroy_stream(self.copy_stream)?)
    }

    fn upload(&mut self, dst: DevicePtr, bytes: &[u8]) -> Result<(), ArrayError> {
        let mut buffer = match self.spare.iter().position(|b| b.len() == bytes.len()) {
            Some(i) => self.spare.swap_remove(i),
            None => self.device.alloc_pinned(bytes.len())?,
        };
        buffer.copy_from_slice(bytes);
        let copy = self
            .device
            .copy_to_device_async(dst, buffer, self.copy_stream)?;
        self.in_flight.push(copy);
        Ok(())
    }
}

impl<T: Pod> ToDevice for [T] {
    type Device = DeviceArray<T>;

    fn upload_with(&self, uploader: &mut Uploader<'_, '_>) -> Result<DeviceArray<T>, ArrayError> {
        uploader.upload_array(&[self.len()], self)
    }
}

impl<T: Pod> ToDevice for HostArray<T> {
    type Device = DeviceArray<T>;

    fn upload_with(&self, uploader: &mut Uploader<'_, '_>) -> Result<DeviceArray<T>, ArrayError> {
        uploader.upload_array(self.shape(), self.data())
    }
}

impl<T: Pod> ToDevice for PinnedHostArray<T> {
    type Device = DeviceArray<T>;

    fn upload_with(&self, uploader: &mut Uploader<'_, '_>) -> Result<DeviceArray<T>, ArrayError> {
        uploader.upload_array(self.shape(), self.as_slice())
    }
}

impl<T: Pod> ToHost for DeviceArray<T> {
    type Host = HostArray<T>;

    fn to_host(&self) -> Result<HostArray<T>, ArrayError> {
        HostArray::from_device(self)
    }
}

/// A borrowed value uploads as the value does (so `batches(&host_batches)` works).
impl<X: ToDevice + ?Sized> ToDevice for &X {
    type Device = X::Device;

    fn upload_with(&self, uploader: &mut Uploader<'_, '_>) -> Result<X::Device, ArrayError> {
        (**self).upload_with(uploader)
    }
}

impl<X: ToDevice> ToDevice for Vec<X> {
    type Device = Vec<X::Device>;

    fn upload_with(&self, uploader: &mut Uploader<'_, '_>) -> Result<Self::Device, ArrayError> {
        self.iter().map(|x| x.upload_with(uploader)).collect()
    }
}

impl<X: ToHost> ToHost for Vec<X> {
    type Host = Vec<X::Host>;

    fn to_host(&self) -> Result<Self::Host, ArrayError> {
        self.iter().map(ToHost::to_host).collect()
    }
}

impl<X: ToDevice> ToDevice for Option<X> {
    type Device = Option<X::Device>;

    fn upload_with(&self, uploader: &mut Uploader<'_, '_>) -> Result<Self::Device, ArrayError> {
        self.as_ref().map(|x| x.upload_with(uploader)).transpose()
    }
}

impl<X: ToHost> ToHost for Option<X> {
    type Host = Option<X::Host>;

    fn to_host(&self) -> Result<Self::Host, ArrayError> {
        self.as_ref().map(ToHost::to_host).transpose()
    }
}

/// `ToDevice` and `ToHost` for a tuple of the given element type names.
macro_rules! tuple_impls {
    ($($name:ident),+) => {
        impl<$($name: ToDevice),+> ToDevice for ($($name,)+) {
            type Device = ($($name::Device,)+);

            #[allow(non_snake_case)]
            fn upload_with(&self, uploader: &mut Uploader<'_, '_>) -> Result<Self::Device, ArrayError> {
                let ($($name,)+) = self;
                Ok(($($name.upload_with(uploader)?,)+))
            }
        }

        impl<$($name: ToHost),+> ToHost for ($($name,)+) {
            type Host = ($($name::Host,)+);

            #[allow(non_snake_case)]
            fn to_host(&self) -> Result<Self::Host, ArrayError> {
                let ($($name,)+) = self;
                Ok(($($name.to_host()?,)+))
            }
        }
    };
}

tuple_impls!(A);
tuple_impls!(A, B);
tuple_impls!(A, B, C);
tuple_impls!(A, B, C, D);
tuple_impls!(A, B, C, D, E);
tuple_impls!(A, B, C, D, E, F);
