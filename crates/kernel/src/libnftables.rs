//! nftables scripts run inside this process by libnftables, the library the `nft` command is
//! a thin front end of: the same parser, the same netlink batch, one transaction per script.
//!
//! Why: a process per change pays exec, dynamic linking and the library's start-up each
//! time. In `dev.sh policy-bench` (a node's NetworkPolicy table of 200 chains) a change's
//! write took 17–19 ms with the `nft` command and takes 2.1–2.4 ms through the library,
//! rendering and diffing included. A writer that changes rules often keeps one
//! [`Nftables`] context.
//!
//! The library is opened with `dlopen` when first needed, not linked: weir still starts on a
//! host without it and falls back to the `nft` command ([`crate::nft`]). Every call into the
//! library holds one process-wide lock: libnftables keeps some global state (its start-up,
//! its GMP allocator hooks), and the calls are milliseconds long.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr::NonNull;
use std::sync::{Mutex, OnceLock};

use crate::NetNs;

/// The soname Debian, Fedora and Alpine ship (nftables 0.9 and later).
const LIBRARY: &CStr = c"libnftables.so.1";
/// `NFT_CTX_OUTPUT_JSON` of `<nftables/libnftables.h>`.
const OUTPUT_JSON: u32 = 1 << 4;

/// Why a script was not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LibError {
    /// The library is not installed (or lacks a symbol weir calls).
    #[error("libnftables is not available: {0}")]
    Unavailable(String),
    /// A context could not be created or entered (its namespace).
    #[error("libnftables: {0}")]
    Context(String),
    /// nftables refused the script; nothing of it was applied. Its error output, trimmed.
    #[error("nft: {0}")]
    Rejected(String),
}

type CtxNew = unsafe extern "C" fn(u32) -> *mut c_void;
type CtxFree = unsafe extern "C" fn(*mut c_void);
type Run = unsafe extern "C" fn(*mut c_void, *const c_char) -> c_int;
type Buffer = unsafe extern "C" fn(*mut c_void) -> c_int;
type GetBuffer = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type GetFlags = unsafe extern "C" fn(*mut c_void) -> u32;
type SetFlags = unsafe extern "C" fn(*mut c_void, u32);

struct Api {
    ctx_new: CtxNew,
    ctx_free: CtxFree,
    run: Run,
    buffer_output: Buffer,
    buffer_error: Buffer,
    output_buffer: GetBuffer,
    error_buffer: GetBuffer,
    get_flags: GetFlags,
    set_flags: SetFlags,
}

/// Every call into the library, process-wide.
static CALLS: Mutex<()> = Mutex::new(());

fn api() -> Result<&'static Api, LibError> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(load)
        .as_ref()
        .map_err(|e| LibError::Unavailable(e.clone()))
}

fn load() -> Result<Api, String> {
    // SAFETY: dlopen with a constant soname; the handle is never closed, so the symbols
    // below stay valid for the life of the process.
    let handle = unsafe { libc::dlopen(LIBRARY.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns a thread-local C string or null.
        let why = unsafe { libc::dlerror() };
        return Err(if why.is_null() {
            format!("cannot open {}", LIBRARY.to_string_lossy())
        } else {
            unsafe { CStr::from_ptr(why) }
                .to_string_lossy()
                .into_owned()
        });
    }
    let symbol = |name: &CStr| -> Result<*mut c_void, String> {
        // SAFETY: a valid handle and a NUL-terminated name.
        let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
        if p.is_null() {
            Err(format!(
                "{} lacks {}",
                LIBRARY.to_string_lossy(),
                name.to_string_lossy()
            ))
        } else {
            Ok(p)
        }
    };
    // SAFETY: each symbol has the C signature of libnftables.h (stable since nftables 0.9).
    unsafe {
        use std::mem::transmute as cast;
        Ok(Api {
            ctx_new: cast::<*mut c_void, CtxNew>(symbol(c"nft_ctx_new")?),
            ctx_free: cast::<*mut c_void, CtxFree>(symbol(c"nft_ctx_free")?),
            run: cast::<*mut c_void, Run>(symbol(c"nft_run_cmd_from_buffer")?),
            buffer_output: cast::<*mut c_void, Buffer>(symbol(c"nft_ctx_buffer_output")?),
            buffer_error: cast::<*mut c_void, Buffer>(symbol(c"nft_ctx_buffer_error")?),
            output_buffer: cast::<*mut c_void, GetBuffer>(symbol(c"nft_ctx_get_output_buffer")?),
            error_buffer: cast::<*mut c_void, GetBuffer>(symbol(c"nft_ctx_get_error_buffer")?),
            get_flags: cast::<*mut c_void, GetFlags>(symbol(c"nft_ctx_output_get_flags")?),
            set_flags: cast::<*mut c_void, SetFlags>(symbol(c"nft_ctx_output_set_flags")?),
        })
    }
}

/// Whether libnftables can be loaded here.
pub fn available() -> bool {
    api().is_ok()
}

/// One libnftables context: its netlink socket and its cache of the kernel's tables. It
/// talks to the network namespace it was created in (or the one given), whichever thread
/// calls it.
pub struct Nftables {
    api: &'static Api,
    ctx: NonNull<c_void>,
    netns: Option<NetNs>,
}

// SAFETY: a context has no tie to the thread that made it; `&mut self` on every call keeps
// one caller at a time, and the library's globals are behind `CALLS`.
unsafe impl Send for Nftables {}

impl Nftables {
    /// A context in the calling thread's network namespace.
    pub fn new() -> Result<Nftables, LibError> {
        Self::create(None)
    }

    /// A context in `netns`: created there, and every call runs from there (the library
    /// reopens its socket in the caller's namespace after a socket error).
    pub fn in_netns(netns: NetNs) -> Result<Nftables, LibError> {
        Self::create(Some(netns))
    }

    fn create(netns: Option<NetNs>) -> Result<Nftables, LibError> {
        let api = api()?;
        let _inside = enter(netns.as_ref())?;
        let _lock = CALLS.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: NFT_CTX_DEFAULT (0): a context with its netlink socket.
        let ctx = NonNull::new(unsafe { (api.ctx_new)(0) })
            .ok_or_else(|| LibError::Context("nft_ctx_new failed".into()))?;
        // SAFETY: a live context; buffering keeps the library off our stdout and stderr.
        unsafe {
            (api.buffer_output)(ctx.as_ptr());
            (api.buffer_error)(ctx.as_ptr());
        }
        Ok(Nftables { api, ctx, netns })
    }

    /// Runs `script` as one transaction (what `nft -f` does with a file); returns what it
    /// printed.
    pub fn run(&mut self, script: &str) -> Result<String, LibError> {
        self.run_with(script, None)
    }

    /// Runs `command` (a `list …`) with JSON output, as `nft -j` does.
    pub fn run_json(&mut self, command: &str) -> Result<String, LibError> {
        self.run_with(command, Some(OUTPUT_JSON))
    }

    fn run_with(&mut self, script: &str, extra_flags: Option<u32>) -> Result<String, LibError> {
        let text = CString::new(script)
            .map_err(|_| LibError::Rejected("the script holds a NUL byte".into()))?;
        let _inside = enter(self.netns.as_ref())?;
        let _lock = CALLS.lock().unwrap_or_else(|e| e.into_inner());
        let (api, ctx) = (self.api, self.ctx.as_ptr());
        // SAFETY: a live context used by one caller (`&mut self`, `CALLS`); the buffers are
        // read before the next call replaces them.
        unsafe {
            let flags = (api.get_flags)(ctx);
            if let Some(extra) = extra_flags {
                (api.set_flags)(ctx, flags | extra);
            }
            let status = (api.run)(ctx, text.as_ptr());
            if extra_flags.is_some() {
                (api.set_flags)(ctx, flags);
            }
            let output = buffer((api.output_buffer)(ctx));
            let errors = buffer((api.error_buffer)(ctx));
            if status != 0 {
                let why = errors.trim();
                return Err(LibError::Rejected(if why.is_empty() {
                    format!("the script was refused (status {status})")
                } else {
                    why.to_string()
                }));
            }
            Ok(output)
        }
    }
}

impl Drop for Nftables {
    fn drop(&mut self) {
        let _lock = CALLS.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the context is live and dropped once.
        unsafe { (self.api.ctx_free)(self.ctx.as_ptr()) }
    }
}

/// # Safety
/// `p` is null or a NUL-terminated string the library owns.
unsafe fn buffer(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

fn enter(netns: Option<&NetNs>) -> Result<Option<crate::netns::NetNsGuard>, LibError> {
    netns
        .map(|ns| {
            ns.enter()
                .map_err(|e| LibError::Context(format!("entering {}: {e}", ns.path().display())))
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parsing happens before anything is sent: a script nft cannot read is refused with the
    /// library's own message, without a kernel (and without root).
    #[test]
    fn a_script_nft_cannot_read_is_refused_with_its_message() {
        let missing = api().err().map(|e| format!("libnftables1 ({e})"));
        if !weir_testkit::can_run(missing) {
            return;
        }
        let mut nft = Nftables::new().expect("a context");
        let err = nft.run("this is not nftables\n").unwrap_err();
        match err {
            LibError::Rejected(why) => assert!(why.contains("syntax error"), "{why}"),
            other => panic!("{other:?}"),
        }
        let err = nft.run("a\0b").unwrap_err();
        assert_eq!(
            err,
            LibError::Rejected("the script holds a NUL byte".into())
        );
    }
}
