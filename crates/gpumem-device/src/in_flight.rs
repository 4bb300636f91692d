//! [`InFlight`]: a value lent to the device until an event completes.

use std::fmt;

use crate::{Device, DeviceError, EventId};

/// A value the device may still be using, typically the [`crate::PinnedBuffer`] of an
/// asynchronous copy ([`Device::copy_to_device_async`], [`Device::copy_to_host_async`]). The
/// value comes back only once the copy's event has completed, through [`InFlight::wait`] or
/// [`InFlight::try_finish`]; dropping an `InFlight` waits for the event first. So safe code
/// cannot read, change or free a buffer under a running copy.
///
/// The event belongs to the `InFlight` and is destroyed once it has completed. If completion
/// cannot be established (waiting fails, e.g. on a lost device), the value is leaked rather
/// than freed: a leak is safe, a free under a running copy is not.
#[must_use = "dropping an in-flight value blocks until the device is done with it"]
pub struct InFlight<'d, T> {
    /// `Some` until the value is given back; an `Option` only so that it can be moved out of
    /// a type with a destructor.
    value: Option<T>,
    /// The event to wait for, or `None` once nothing needs waiting for.
    completion: Option<Completion<'d>>,
}

#[derive(Clone, Copy)]
struct Completion<'d> {
    device: &'d dyn Device,
    event: EventId,
}

impl<'d, T> InFlight<'d, T> {
    /// A value the device is already done with: what a synchronous copy returns.
    pub fn completed(value: T) -> Self {
        InFlight {
            value: Some(value),
            completion: None,
        }
    }

    /// A value the device uses until `event` on `device` completes. A backend builds this
    /// right after enqueueing the copy that uses `value` and recording `event` behind it; the
    /// `InFlight` owns the event from then on.
    pub fn pending(device: &'d dyn Device, event: EventId, value: T) -> Self {
        InFlight {
            value: Some(value),
            completion: Some(Completion { device, event }),
        }
    }

    /// Blocks until the device is done with the value, and gives it back. On an error the
    /// value is given up (leaked if the wait itself failed, see [`InFlight`]).
    pub fn wait(mut self) -> Result<T, DeviceError> {
        self.settle()?;
        Ok(self.take())
    }

    /// Gives the value back if the device is done with it (`Ok(Ok(value))`), or this
    /// `InFlight` back if not (`Ok(Err(self))`); never blocks. On an error querying the event,
    /// the `InFlight` is dropped, which waits.
    pub fn try_finish(mut self) -> Result<Result<T, Self>, DeviceError> {
        if let Some(c) = self.completion {
            if !c.device.event_completed(c.event)? {
                return Ok(Err(self));
            }
            self.completion = None;
            c.device.destroy_event(c.event)?;
        }
        Ok(Ok(self.take()))
    }

    /// Waits for the event, if any, and destroys it. If the wait fails the value is leaked.
    fn settle(&mut self) -> Result<(), DeviceError> {
        if let Some(c) = self.completion.take() {
            if let Err(e) = c.device.wait_event(c.event) {
                std::mem::forget(self.value.take());
                return Err(e);
            }
            c.device.destroy_event(c.event)?;
        }
        Ok(())
    }

    fn take(&mut self) -> T {
        self.value
            .take()
            .expect("an InFlight holds its value until it is given back")
    }
}

impl<T> Drop for InFlight<'_, T> {
    fn drop(&mut self) {
        // A destructor cannot report an error; `settle` has already kept the value from
        // being freed under a copy that may still run.
        let _ = self.settle();
    }
}

/// Shows the event only: the value may be in use by the device and is not read.
impl<T> fmt::Debug for InFlight<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlight")
            .field("event", &self.completion.map(|c| c.event))
            .finish_non_exhaustive()
    }
}
