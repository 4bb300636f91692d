//! Hash maps keyed by device address, with a hasher made for them.
//!
//! Pools, policies, traces and replays look blocks up by address on every operation. The
//! standard SipHash guards against adversarial keys at a cost larger than the rest of a free;
//! addresses are trusted, distinct and usually multiples of 512, so one multiplication with the
//! high bits folded down (so the bucket index does not see the zero low bits) spreads them.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use crate::DevicePtr;

/// A one-multiply hasher for device addresses.
#[derive(Clone, Copy, Debug, Default)]
pub struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(self.0.rotate_left(8) ^ u64::from(b));
        }
    }

    fn write_u64(&mut self, value: u64) {
        let h = value.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 32);
    }
}

/// A map from device address to `V`.
pub type AddressMap<V> = HashMap<DevicePtr, V, BuildHasherDefault<AddressHasher>>;

/// A set of device addresses.
pub type AddressSet = HashSet<DevicePtr, BuildHasherDefault<AddressHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn aligned_addresses_spread_over_buckets() {
        let build = BuildHasherDefault::<AddressHasher>::default();
        let buckets: HashSet<u64> = (0..1024u64)
            .map(|i| build.hash_one(0x7f00_0000_0000 + i * 512) & 1023)
            .collect();
        assert!(
            buckets.len() > 600,
            "only {} of 1024 buckets used",
            buckets.len()
        );
        let mut map = AddressMap::default();
        map.insert(512, "a");
        assert_eq!(map.get(&512), Some(&"a"));
    }
}
