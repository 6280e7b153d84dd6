//! The one lock convention of the gateway.
//!
//! Shared state sits behind a `std::sync::Mutex` (or `RwLock`) taken
//! through [`Locked`]: the guard is held for a few map or vector operations,
//! never across an `.await` (tokio's `Mutex` only where a task must wait its
//! turn, e.g. the pool's single-flight dial), and no code panics while
//! holding it. A lock poisoned by a panic elsewhere is therefore taken as
//! it is: one task's panic must not turn every later connection, drain or
//! scrape into a panic of its own.
//!
//! Where two locks are held at once, the outer one is named in the doc of
//! the struct that owns both (e.g. the pool's `keys` before a key's
//! `tunnels`).

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Takes a lock the gateway's way (see the module doc).
pub trait Locked<T: ?Sized> {
    /// The guard, whether or not a panic poisoned the lock.
    fn locked(&self) -> MutexGuard<'_, T>;
}

// The convention itself: the one place the lock methods `clippy.toml`
// refuses elsewhere are called.
#[allow(clippy::disallowed_methods)]
impl<T: ?Sized> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// [`Locked`] for a reader-writer lock.
pub trait ReadWriteLocked<T: ?Sized> {
    /// A read guard, whether or not a panic poisoned the lock.
    fn read_locked(&self) -> RwLockReadGuard<'_, T>;
    /// A write guard, whether or not a panic poisoned the lock.
    fn write_locked(&self) -> RwLockWriteGuard<'_, T>;
}

#[allow(clippy::disallowed_methods)]
impl<T: ?Sized> ReadWriteLocked<T> for RwLock<T> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_locked(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A panic while the lock was held leaves it usable.
    #[test]
    #[allow(clippy::disallowed_methods)] // poisons them the std way
    fn a_poisoned_lock_is_taken_as_it_is() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let rw = std::sync::Arc::new(RwLock::new(1));
        let (m2, rw2) = (m.clone(), rw.clone());
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            let _w = rw2.write().unwrap();
            panic!("poison both");
        })
        .join();
        assert!(m.is_poisoned() && rw.is_poisoned());
        *m.locked() += 1;
        *rw.write_locked() += 1;
        assert_eq!((*m.locked(), *rw.read_locked()), (2, 2));
    }
}
