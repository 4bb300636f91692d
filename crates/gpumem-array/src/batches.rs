//! [`Batches`]: a double-buffered iterator that uploads the next batch while this one is in
//! use.

use gpumem_device::{EventId, InFlight, PinnedBuffer};

use crate::adapt::{Staging, Uploader};
use crate::{ArrayError, DeviceContext, ToDevice};

/// Device batches from an iterator of host batches, uploaded one ahead (like CUDA.jl's
/// `CuIterator`); made by [`DeviceContext::batches`].
///
/// While the consumer works on batch k (on the context's stream), batch k+1 is already being
/// copied on a separate copy stream, from pinned staging buffers that are reused from batch
/// to batch, so the upload overlaps the compute. Events order it all: an upload starts only
/// after the compute stream's work issued so far (its memory may be a block that work just
/// freed), and the compute stream's later work waits for the upload. A batch's device memory
/// goes back to the pool when the consumer drops it, so with the usual `for` loop (each batch
/// dropped before the next is asked for) at most two batches are on the device.
///
/// After an error the iterator yields it once and then ends.
pub struct Batches<'d, I: Iterator>
where
    I::Item: ToDevice,
{
    context: &'d DeviceContext,
    source: I,
    staging: Staging<'d>,
    /// The next batch, uploaded or being uploaded, with its copies.
    next: Option<Prepared<'d, <I::Item as ToDevice>::Device>>,
    /// The copies of the batch handed out last; their buffers are reused once they complete.
    handed_copies: Vec<InFlight<'d, PinnedBuffer>>,
    started: bool,
    done: bool,
}

/// A batch whose upload was issued: the copies that still use its staging buffers, and the
/// event that completes with them.
struct Prepared<'d, B> {
    batch: B,
    copies: Vec<InFlight<'d, PinnedBuffer>>,
    uploaded: EventId,
}

impl DeviceContext {
    /// Device batches uploaded one ahead from `source`'s host batches (see [`Batches`]).
    /// Creates the copy stream; the device arrays belong to this context's stream.
    pub fn batches<I>(&self, source: I) -> Result<Batches<'_, I::IntoIter>, ArrayError>
    where
        I: IntoIterator,
        I::Item: ToDevice,
    {
        let copy_stream = self.device().create_stream()?;
        Ok(Batches {
            context: self,
            source: source.into_iter(),
            staging: Staging::new(self.device(), copy_stream),
            next: None,
            handed_copies: Vec::new(),
            started: false,
            done: false,
        })
    }
}

impl<'d, I: Iterator> Batches<'d, I>
where
    I::Item: ToDevice,
{
    /// Takes the next host batch and issues its upload, or `None` at the end.
    fn prepare(
        &mut self,
    ) -> Result<Option<Prepared<'d, <I::Item as ToDevice>::Device>>, ArrayError> {
        let Some(host) = self.source.next() else {
            return Ok(None);
        };
        self.staging.begin_batch(self.context)?;
        let uploaded = host.upload_with(&mut Uploader::staged(self.context, &mut self.staging));
        let (event, copies) = self.staging.finish_batch()?;
        match uploaded {
            Ok(batch) => Ok(Some(Prepared {
                batch,
                copies,
                uploaded: event,
            })),
            Err(e) => {
                self.staging.discard(event, copies)?;
                Err(e)
            }
        }
    }

    fn advance(&mut self) -> Result<Option<<I::Item as ToDevice>::Device>, ArrayError> {
        if !self.started {
            self.started = true;
            self.next = self.prepare()?;
        }
        let Some(Prepared {
            batch,
            copies,
            uploaded,
        }) = self.next.take()
        else {
            return Ok(None);
        };
        // The consumer's stream waits for this batch's upload; the batch before this one was
        // consumed, so its copies are long done: reuse their buffers. Then upload the batch
        // after this one while the consumer works on this one.
        if let Err(e) = self.staging.hand_over(uploaded, self.context.stream()) {
            // The copies first (this waits for them), then the memory they wrote.
            drop(copies);
            drop(batch);
            return Err(e);
        }
        let previous = std::mem::replace(&mut self.handed_copies, copies);
        self.staging.recycle(previous)?;
        self.next = self.prepare()?;
        Ok(Some(batch))
    }
}

impl<I: Iterator> Iterator for Batches<'_, I>
where
    I::Item: ToDevice,
{
    type Item = Result<<I::Item as ToDevice>::Device, ArrayError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.advance() {
            Ok(Some(batch)) => Some(Ok(batch)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

impl<I: Iterator> Drop for Batches<'_, I>
where
    I::Item: ToDevice,
{
    fn drop(&mut self) {
        // The copies first (this waits for them), then the memory they wrote.
        if let Some(Prepared {
            batch,
            copies,
            uploaded,
        }) = self.next.take()
        {
            // A destructor cannot report; the copies have been waited for either way.
            let _ = self.staging.discard(uploaded, copies);
            drop(batch);
        }
        let _ = self.staging.finish(std::mem::take(&mut self.handed_copies));
    }
}
