//! Host driver discovery for vgpu-shim.
//!
//! * [`cache`]: a reader for glibc's `/etc/ld.so.cache` (old and new formats);
//! * [`exports`]: the defined dynamic symbols and SONAME of an ELF shared object;
//! * [`check`]: which exports of the real driver a shim lacks;
//! * [`root`]: another machine's file system seen through a folder (`/host`), links
//!   resolved inside it;
//! * [`discover`](mod@discover): the host's real NVIDIA user-space libraries, tools and
//!   version (also inside a mounted host root and the GPU Operator's driver root), and
//!   every path at which the loader could find a library;
//! * [`prepare`](mod@prepare): the driver folder the shims forward to
//!   (`DEST/<version>/lib64`, `bin`, `shim`, `driver.json`), guarded by the export check;
//! * [`versions`]: the version folders of DEST and the `current` link that names the
//!   one in use;
//! * [`layout`]: the container-side mounts and env as data.
//!
//! Nothing here panics on bad input or writes to stdout; the `vgpu-ldconfig` binary is
//! the only printer.

#![forbid(unsafe_code)]

pub mod cache;
pub mod check;
pub mod discover;
pub mod exports;
pub mod layout;
pub mod prepare;
pub mod root;
mod sha256;
pub mod versions;

pub use cache::{CacheEntry, CacheError, parse_cache, read_cache};
pub use check::{CheckReport, missing_exports};
pub use discover::{
    CacheSource, DiscoverError, DiscoverOptions, DriverLibrary, HostDriver, discover, loader_paths,
};
pub use exports::{ExportError, defined_functions, soname};
pub use layout::{ContainerLayout, LayoutPaths, Mount};
pub use prepare::{PrepareError, PrepareOptions, PrepareOutcome, prepare};
pub use versions::prepared_dir;
