//! The per-device pool of free buffers: the result buffers a run frees are kept, keyed
//! by element type and length, and handed out again where results of that type and
//! length are made — later in the same run, and by the next run on the same device
//! (step N+1 of a training loop reuses step N's buffers).
//!
//! The pool is per thread: a [`ThreadMesh`](super::ThreadMesh) device is a thread, an
//! MPI rank runs its program on one thread, and the reference interpreter pools on its
//! caller's thread. Kernels take from it without being handed a pool: [`take`] (or
//! [`take_array`], [`filled`], [`with_capacity`]) where a result buffer is made,
//! [`give`] (or [`release`], for a value the loop still counts as live) where a
//! uniquely owned buffer dies.
//!
//! Buffers are handed out only during a run ([`start_run`] to the end of its [`Run`]):
//! a kernel called outside one (`kernels::eval` from a test's oracle between two runs,
//! say) makes fresh buffers and leaves the pool to the next run.
//!
//! Bound: a run's evaluation loop sets a *budget* ([`start_run`]) — the most bytes its
//! live values and the pool may hold together: the plan's peak (see
//! [`MemoryAnalysis`](crate::analysis::MemoryAnalysis)) plus the pool's [`headroom`]
//! over it, an eighth of the peak (1 MiB at least) within the device's memory limit —
//! and tells the pool how many bytes are live, as that analysis models the buffers (a
//! result written in place of an operand, a deferred broadcast, a constant: no new
//! buffer), which is what the device holds rather than what the loop counts against
//! its memory limit: after each node ([`set_live`]), and before each node with the
//! scratch its kernel may need ([`reserve`], which frees pooled buffers until the live
//! bytes, the scratch and the pool fit the budget). A buffer given back is kept only
//! while the live bytes plus the pooled bytes stay within the budget; otherwise it is
//! freed. Between runs the pool holds at most the last run's budget less its live
//! bytes at the end. A pooled buffer is not a live value: it never counts against a
//! run's memory limit, and [`pooled_bytes`] reports what all threads' pools hold.
//!
//! Which buffers go when they do not all fit: the plan knows, node by node, which new
//! buffers a run asks for ([`Requests`], from the liveness walk), and a run follows
//! them ([`follow`]). What goes first is the buffer asked for again farthest ahead (in
//! this run, else in the next run of the same program: a training loop's next step;
//! never asked for: first of all), as an optimal cache replacement (Belady's) does; a
//! buffer given back that does not fit is kept in place of pooled ones asked for later
//! than it. Among buffers asked for equally far ahead, few bytes beyond what must go
//! (see [`to_free`]).

use std::any::Any;
use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};
use rustc_hash::FxHashMap;
use smallvec::{SmallVec, smallvec};

use crate::ir::{DType, Element, Literal};

/// The pool's headroom over a run's peak, as a fraction `1 / HEADROOM` of the peak (see
/// [`headroom`]).
const HEADROOM: usize = 8;

/// The least headroom over a run's peak, in bytes (see [`headroom`]): about a core's L2
/// cache (1 MB on the Zen 4 EPYC of benches/README.md).
const LEAST_HEADROOM: usize = 1 << 20;

/// How many bytes beyond a run's peak of `peak` bytes its live values and the pool may
/// hold together on a device whose memory limit is `memory_limit`: an eighth of the
/// peak, or [`LEAST_HEADROOM`] if that is more, less where the limit leaves less (never
/// past the limit, never below the peak).
///
/// Why any: with a budget of the peak alone every byte is live at the peak, so the pool
/// holds nothing there, and each large buffer asked for around the peak is allocated
/// anew on every run and its pages faulted in again. On the language model at
/// d_model 1024 on one device (a peak of 885 MB) that was seven misses of 8-34 MB a
/// step, about 22,000 page faults and 2% of the step; with the headroom about 700
/// (`perf record -e page-faults`, 2 steps against 5; benches/README.md, "The pool's
/// headroom over the peak"). Why the least: an eighth of a small run's peak (a fused
/// loop over a few thousand elements, a layer on tiny shards) is less than one of its
/// buffers, so its pool missed on most nodes and each miss allocated and zeroed a
/// buffer: a program of 200 ops on `[4, 8]` ran 20% faster with the least headroom
/// (benches/README.md, "The pool's least headroom").
pub(crate) fn headroom(peak: usize, memory_limit: usize) -> usize {
    (peak / HEADROOM)
        .max(LEAST_HEADROOM)
        .min(memory_limit.saturating_sub(peak))
}

/// An element type the pool keeps buffers of: every [`Element`] (every [`Literal`]
/// dtype).
pub(crate) trait Pooled: Element {
    /// The pool's shelf of buffers of `Self`.
    fn shelf(pool: &mut Pool) -> &mut Shelf<Self> {
        let shelf: &mut dyn Any = match Self::DTYPE {
            DType::F32 => &mut pool.f32s,
            DType::BF16 => &mut pool.bf16s,
            DType::F16 => &mut pool.f16s,
            DType::I32 => &mut pool.i32s,
            DType::Bool => &mut pool.bools,
        };
        shelf
            .downcast_mut()
            .expect("the shelf of an element's dtype holds buffers of it")
    }
}

impl<T: Element> Pooled for T {}

/// Free buffers of one element type, by length.
#[derive(Debug)]
pub(crate) struct Shelf<T> {
    by_len: FxHashMap<usize, Vec<Vec<T>>>,
}

impl<T> Default for Shelf<T> {
    fn default() -> Self {
        Shelf {
            by_len: FxHashMap::default(),
        }
    }
}

/// The dtypes of the pool's shelves, in a fixed order (a [`Candidate`]'s `shelf`).
const DTYPES: [DType; 5] = [DType::F32, DType::BF16, DType::F16, DType::I32, DType::Bool];

/// One pooled buffer [`Pool::reserve`] may free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Candidate {
    /// Its shelf: the index of its dtype in [`DTYPES`].
    shelf: usize,
    /// Its length in elements (its key on the shelf).
    len: usize,
    /// The bytes of its allocation.
    bytes: usize,
    /// How many nodes ahead a buffer of its dtype and length is asked for next (see
    /// [`Requests::next`]).
    next: usize,
    /// Whether [`to_free`] picked it so far.
    taken: bool,
}

/// A shelf whatever its element type: what [`Pool::reserve`] needs to free buffers.
trait Evict {
    /// Pushes onto `out` each buffer of the shelf (its `shelf` index given) but, of each
    /// length, as many as `keep` holds that length.
    fn candidates(&self, shelf: usize, keep: &[usize], out: &mut Vec<Candidate>);
    /// Frees one buffer of `len` elements and `bytes` bytes; the bytes freed (0 if
    /// there is none).
    fn free(&mut self, len: usize, bytes: usize) -> usize;
}

impl<T> Evict for Shelf<T> {
    fn candidates(&self, shelf: usize, keep: &[usize], out: &mut Vec<Candidate>) {
        for (&len, buffers) in &self.by_len {
            let spare = keep.iter().filter(|&&k| k == len).count();
            out.extend(buffers.iter().skip(spare).map(|b| Candidate {
                shelf,
                len,
                bytes: bytes_of(b),
                next: usize::MAX,
                taken: false,
            }));
        }
    }

    fn free(&mut self, len: usize, bytes: usize) -> usize {
        let Some(buffers) = self.by_len.get_mut(&len) else {
            return 0;
        };
        match buffers.iter().position(|b| bytes_of(b) == bytes) {
            Some(i) => {
                buffers.swap_remove(i);
                if buffers.is_empty() {
                    self.by_len.remove(&len);
                }
                bytes
            }
            None => 0,
        }
    }
}

/// Leaves in `candidates` those to free so that at least `need` bytes go: those asked
/// for again farthest ahead first (the largest `next`), all of them while they hold no
/// more than what is still needed; among those asked for equally far ahead that hold
/// more, the ones [`fit`] picks. All of them if together they hold less than `need`.
/// The choice depends only on the candidates' sizes, lengths, dtypes and `next`, not
/// on the shelves' order; it allocates nothing.
fn to_free(candidates: &mut Vec<Candidate>, need: usize) {
    // Farthest first; then largest first, equal sizes in a fixed order (for `fit`).
    candidates.sort_unstable_by_key(|c| {
        (
            std::cmp::Reverse(c.next),
            std::cmp::Reverse(c.bytes),
            c.len,
            c.shelf,
        )
    });
    let mut rest = need;
    let mut start = 0;
    while start < candidates.len() && rest > 0 {
        let next = candidates[start].next;
        let end = start
            + (candidates[start..].iter())
                .take_while(|c| c.next == next)
                .count();
        let group = &mut candidates[start..end];
        let bytes: usize = group.iter().map(|c| c.bytes).sum();
        if bytes <= rest {
            group.iter_mut().for_each(|c| c.taken = true);
            rest -= bytes;
        } else {
            fit(group, rest);
            rest = 0;
        }
        start = end;
    }
    candidates.retain(|c| c.taken);
}

/// Marks in `candidates` (largest first, holding more than `need` together) those to
/// free so that at least `need` bytes go, freeing few bytes beyond `need`: the smaller
/// total of (a) the smallest buffer of `need` bytes or more and (b) the largest
/// buffers, each while it fits in what is still needed, topped up with the smallest
/// buffer left that covers the rest, less the smallest of them that the others cover
/// without (fewer buffers on a tie).
fn fit(candidates: &mut [Candidate], need: usize) {
    let single = candidates.iter().rposition(|c| c.bytes >= need);
    let mut rest = need;
    for c in candidates.iter_mut() {
        c.taken = rest > 0 && c.bytes <= rest;
        if c.taken {
            rest -= c.bytes;
        }
    }
    if rest > 0 {
        // The total exceeds `need`, so some buffer left covers the rest.
        if let Some(c) = (candidates.iter_mut()).rfind(|c| !c.taken && c.bytes >= rest) {
            c.taken = true;
        }
    }
    // The smallest taken ones that the others cover without are not needed.
    let mut filled: usize = candidates.iter().filter(|c| c.taken).map(|c| c.bytes).sum();
    for c in candidates.iter_mut().rev() {
        if c.taken && filled - c.bytes >= need {
            c.taken = false;
            filled -= c.bytes;
        }
    }
    if let Some(k) = single.filter(|&k| candidates[k].bytes <= filled) {
        candidates.iter_mut().for_each(|c| c.taken = false);
        candidates[k].taken = true;
    }
}

/// The new buffers a run of one program asks the pool for, by node (see the module
/// docs): made by the plan from the liveness walk, which knows where a node's result
/// takes an operand's buffer and where it needs a new one.
#[derive(Debug, Default)]
pub(crate) struct Requests {
    /// The program's node count: a run's positions are below it.
    nodes: usize,
    /// By dtype and length: the positions of the nodes asking for such a buffer,
    /// ascending.
    at: FxHashMap<(DType, usize), Vec<usize>>,
    /// Every request `(position, dtype, length)`, by position (see [`Requests::of`]).
    by_node: Vec<(usize, DType, usize)>,
}

impl Requests {
    /// The requests of a program of `nodes` nodes: `(position, dtype, length)` each.
    pub(crate) fn new(
        nodes: usize,
        requests: impl IntoIterator<Item = (usize, DType, usize)>,
    ) -> Self {
        let mut by_node: Vec<(usize, DType, usize)> = requests.into_iter().collect();
        by_node.sort_by_key(|&(position, ..)| position);
        let mut at: FxHashMap<(DType, usize), Vec<usize>> = FxHashMap::default();
        for &(position, dtype, len) in &by_node {
            at.entry((dtype, len)).or_default().push(position);
        }
        Requests { nodes, at, by_node }
    }

    /// The new buffers the node at position `now` asks for: `(dtype, length)` each (a
    /// fusion group's root one per result not written in place of an operand).
    fn of(&self, now: usize) -> impl Iterator<Item = (DType, usize)> + '_ {
        let first = self.by_node.partition_point(|&(p, ..)| p < now);
        self.by_node[first..]
            .iter()
            .take_while(move |&&(p, ..)| p == now)
            .map(|&(_, dtype, len)| (dtype, len))
    }

    /// How many nodes after position `now` a buffer of `len` elements of `dtype` is
    /// asked for next: at `now` or later in this run, else in the next run of the
    /// program (a training loop's next step); `usize::MAX` if never.
    fn next(&self, dtype: DType, len: usize, now: usize) -> usize {
        let Some(positions) = self.at.get(&(dtype, len)) else {
            return usize::MAX;
        };
        let later = positions.partition_point(|&p| p < now);
        match positions.get(later) {
            Some(&p) => p - now,
            None => positions.first().map_or(usize::MAX, |&p| {
                self.nodes.saturating_sub(now).saturating_add(p)
            }),
        }
    }
}

/// One thread's pool (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Pool {
    f32s: Shelf<f32>,
    bf16s: Shelf<bf16>,
    f16s: Shelf<f16>,
    i32s: Shelf<i32>,
    bools: Shelf<bool>,
    /// The bytes of the buffers on the shelves (their capacities).
    pooled: usize,
    /// The most bytes live values and pooled buffers may hold together.
    budget: usize,
    /// The bytes of live values, as the evaluation loop last reported them.
    live: usize,
    /// Whether a run is going on (buffers are handed out only then).
    running: bool,
    /// Scratch space of [`Pool::reserve`] (empty between calls).
    candidates: Vec<Candidate>,
    /// The requests of the program being run (see [`follow`]), if any.
    requests: Option<Arc<Requests>>,
    /// The position of the node being run in that program.
    now: usize,
}

impl Drop for Pool {
    /// A thread's pool ends with its thread: its bytes leave [`pooled_bytes`].
    fn drop(&mut self) {
        self.clear();
    }
}

thread_local! {
    static POOL: RefCell<Pool> = RefCell::new(Pool::default());
}

/// The bytes held by every thread's pool.
static POOLED: AtomicUsize = AtomicUsize::new(0);

/// The bytes of a buffer's allocation.
fn bytes_of<T>(buffer: &Vec<T>) -> usize {
    buffer.capacity() * size_of::<T>()
}

impl Pool {
    fn take<T: Pooled>(&mut self, len: usize) -> Option<Vec<T>> {
        if !self.running {
            return None;
        }
        let buffer = T::shelf(self).by_len.get_mut(&len)?.pop()?;
        let bytes = bytes_of(&buffer);
        self.pooled -= bytes;
        POOLED.fetch_sub(bytes, Ordering::Relaxed);
        Some(buffer)
    }

    /// Keeps `buffer` if it fits the budget: with the live bytes as they are if `live`
    /// (the buffer is counted among them: it now moves to the pool), else on top.
    fn give<T: Pooled>(&mut self, buffer: Vec<T>, live: bool) {
        let bytes = bytes_of(&buffer);
        let after = if live {
            self.live = self.live.saturating_sub(bytes);
            self.live
        } else {
            self.live
        };
        let over =
            (after.saturating_add(self.pooled).saturating_add(bytes)).saturating_sub(self.budget);
        if buffer.is_empty() || (over > 0 && !self.make_room::<T>(buffer.len(), over)) {
            return;
        }
        self.pooled += bytes;
        POOLED.fetch_add(bytes, Ordering::Relaxed);
        let len = buffer.len();
        T::shelf(self).by_len.entry(len).or_default().push(buffer);
    }

    /// Frees pooled buffers asked for later than one of `len` elements of `T` (see
    /// [`Requests::next`]) so that `over` more bytes fit, if they hold that many:
    /// whether the buffer may now be pooled.
    fn make_room<T: Pooled>(&mut self, len: usize, over: usize) -> bool {
        let Some(requests) = &self.requests else {
            return false;
        };
        let next = requests.next(T::DTYPE, len, self.now);
        self.free_for(over, None, |c| c.next > next)
    }

    /// Frees pooled buffers until `live` plus `scratch` plus the pooled bytes fit the
    /// budget, keeping the buffers the node's new results may take if it can: those the
    /// followed program's node asks for ([`Requests::of`]: a fusion group's root one per
    /// result), else one of `result`'s dtype and length. It frees the buffers
    /// [`to_free`] picks: those asked for farthest ahead, and few bytes beyond what must
    /// go, since every byte freed is one a later take of that length allocates (and
    /// faults in) again.
    fn reserve(&mut self, live: usize, scratch: usize, result: (DType, usize)) {
        self.live = live;
        let live = live.saturating_add(scratch);
        let need = live.saturating_add(self.pooled).saturating_sub(self.budget);
        if need > 0 {
            let keep: SmallVec<[(DType, usize); 8]> = match &self.requests {
                Some(requests) => requests.of(self.now).collect(),
                None => smallvec![result],
            };
            self.free_for(need, Some(&keep), |_| true);
        }
    }

    /// Frees the pooled buffers [`to_free`] picks among those `eligible` (sparing one
    /// per entry of `keep` of its dtype and length) so that `need` bytes go: with
    /// `keep` (a reservation) as many as it can, without (room for a buffer given back)
    /// none unless they hold `need` bytes. Whether they do.
    fn free_for(
        &mut self,
        need: usize,
        keep: Option<&[(DType, usize)]>,
        eligible: impl Fn(&Candidate) -> bool,
    ) -> bool {
        let before = self.pooled;
        // Kept from one call to the next, so that choosing allocates nothing.
        let mut candidates = std::mem::take(&mut self.candidates);
        candidates.clear();
        for (k, dtype) in DTYPES.into_iter().enumerate() {
            let kept: SmallVec<[usize; 8]> = (keep.unwrap_or_default().iter())
                .filter(|&&(d, _)| d == dtype)
                .map(|&(_, len)| len)
                .collect();
            self.shelf_of(dtype).candidates(k, &kept, &mut candidates);
        }
        if let Some(requests) = &self.requests {
            for c in &mut candidates {
                c.next = requests.next(DTYPES[c.shelf], c.len, self.now);
            }
        }
        candidates.retain(&eligible);
        let enough = candidates.iter().map(|c| c.bytes).sum::<usize>() >= need;
        if enough || keep.is_some() {
            to_free(&mut candidates, need);
            for c in &candidates {
                self.pooled -= self.shelf_of(DTYPES[c.shelf]).free(c.len, c.bytes);
            }
        }
        candidates.clear();
        self.candidates = candidates;
        POOLED.fetch_sub(before - self.pooled, Ordering::Relaxed);
        enough
    }

    /// The shelf of `dtype`'s buffers, whatever their element type.
    fn shelf_of(&mut self, dtype: DType) -> &mut dyn Evict {
        match dtype {
            DType::F32 => &mut self.f32s,
            DType::BF16 => &mut self.bf16s,
            DType::F16 => &mut self.f16s,
            DType::I32 => &mut self.i32s,
            DType::Bool => &mut self.bools,
        }
    }

    /// Frees every pooled buffer.
    fn clear(&mut self) {
        POOLED.fetch_sub(self.pooled, Ordering::Relaxed);
        self.pooled = 0;
        self.f32s.by_len.clear();
        self.bf16s.by_len.clear();
        self.f16s.by_len.clear();
        self.i32s.by_len.clear();
        self.bools.by_len.clear();
    }
}

/// A buffer of exactly `len` elements of `T`: a pooled one (its elements are what its
/// last user left: the caller must write every one before reading it), else a new one
/// of default values.
pub(crate) fn take<T: Pooled>(len: usize) -> Vec<T> {
    POOL.with_borrow_mut(|pool| pool.take(len))
        .unwrap_or_else(|| {
            let mut buffer = vec![T::default(); staggered::<T>(len)];
            buffer.truncate(len);
            buffer
        })
}

/// The page whose offsets [`staggered`] spreads buffers over: loads and stores whose
/// addresses agree in their low 12 bits look alike to the CPU.
const PAGE: usize = 4096;

/// Where [`staggered`] puts each new buffer of at least [`STAGGER_FROM`] bytes after
/// the one allocated before it, modulo the [`PAGE`].
const STAGGER: usize = 512;

/// The fewest bytes of a buffer [`staggered`] pads (it pads by less than a page).
const STAGGER_FROM: usize = 4 * PAGE;

/// The capacity to allocate for a new buffer of `len` elements of `T`: at least `len`,
/// padded (for buffers of [`STAGGER_FROM`] bytes or more) so that the allocation, with
/// the allocator's 8-byte header and 16-byte rounding (glibc's `malloc`, which Rust's
/// `System` allocator calls), spans [`STAGGER`] bytes past a multiple of the page.
///
/// Why: allocations carved one after another from the allocator's heap follow each other
/// at the distance of their sizes, so buffers of a size that is a multiple of the page
/// start 16, 32, 48, ... bytes apart modulo the page. A loop storing into one while it
/// loads the next elements of another that starts a few dozen bytes before it modulo
/// the page has each load wait for a store it only seems to depend on (*4K aliasing*):
/// an AdamW update of 4,096 elements ran 1.6-1.9 times slower on a fresh thread's
/// buffers than the same loop on buffers placed apart (benches/README.md). Staggered by
/// [`STAGGER`], buffers allocated in a row start 0 or at least 512 bytes apart modulo
/// the page, out of that window (0 is no aliasing: a load and a store of the same index).
/// Large buffers that the allocator maps from the system start 16 bytes past a page
/// each, the same offset, which is as good; other allocators are only padded by less
/// than a page.
fn staggered<T>(len: usize) -> usize {
    let size = size_of::<T>();
    let bytes = len.saturating_mul(size);
    if bytes < STAGGER_FROM || size == 0 {
        return len;
    }
    let chunk = (bytes + 8).next_multiple_of(16);
    let pad = (STAGGER + PAGE - chunk % PAGE) % PAGE;
    len + pad.div_ceil(size)
}

/// An empty vector with room for `len` elements of `T`, on a pooled buffer of that
/// length if there is one (for results built by pushing).
pub(crate) fn with_capacity<T: Pooled>(len: usize) -> Vec<T> {
    match POOL.with_borrow_mut(|pool| pool.take(len)) {
        Some(mut buffer) => {
            buffer.clear();
            buffer
        }
        None => Vec::with_capacity(staggered::<T>(len)),
    }
}

/// An array of `shape` on a [`take`]n buffer (elements unspecified: write them all).
pub(crate) fn take_array<T: Pooled>(shape: &[usize]) -> ArrayD<T> {
    let len = shape.iter().product();
    ArrayD::from_shape_vec(IxDyn(shape), take(len)).expect("the buffer has the shape's length")
}

/// An array of `shape` holding `value` everywhere, on a [`take`]n buffer.
pub(crate) fn filled<T: Pooled>(shape: &[usize], value: T) -> ArrayD<T> {
    let mut buffer = take(shape.iter().product());
    buffer.fill(value);
    ArrayD::from_shape_vec(IxDyn(shape), buffer).expect("the buffer has the shape's length")
}

/// Gives `buffer`, scratch the evaluation loop does not count as live, back to this
/// thread's pool (or frees it), keyed by its length.
pub(crate) fn give_buffer<T: Pooled>(buffer: Vec<T>) {
    POOL.with_borrow_mut(|pool| pool.give(buffer, false));
}

/// Gives the buffer of `lit`, which the evaluation loop does not count as live
/// (scratch, or a value it stopped counting), back to this thread's pool (or frees it:
/// see the module's bound).
pub(crate) fn give(lit: Literal) {
    give_literal(lit, false);
}

/// Gives the buffer of `lit`, a value the evaluation loop still counts as live (an
/// operand handed over to a kernel, a resident value replaced), back to this thread's
/// pool: it stops counting as live, so the pool may keep it where [`give`] would free
/// it.
pub(crate) fn release(lit: Literal) {
    give_literal(lit, true);
}

/// Gives the buffers of `values`, which the caller is done with, to this thread's pool:
/// the next run on this thread writes its results into them instead of allocating (and
/// zeroing) new buffers, as a training loop's next step does with the outputs it
/// replaces. Pass the outputs of the last run on this thread (the pool stops counting
/// them as live); the pool keeps them within its bound (the run's budget, see the module
/// docs) and frees the rest.
pub fn recycle(values: impl IntoIterator<Item = Literal>) {
    values.into_iter().for_each(release);
}

/// [`release`] for an operand, if it was handed over (owned).
pub(crate) fn release_operand(value: Cow<'_, Literal>) {
    if let Cow::Owned(lit) = value {
        release(lit);
    }
}

fn give_literal(lit: Literal, live: bool) {
    fn to_pool<T: Pooled>(a: ArrayD<T>, live: bool) {
        let buffer = a.into_raw_vec_and_offset().0;
        POOL.with_borrow_mut(|pool| pool.give(buffer, live));
    }
    match lit {
        Literal::F32(a) => to_pool(a, live),
        Literal::BF16(a) => to_pool(a, live),
        Literal::F16(a) => to_pool(a, live),
        Literal::I32(a) => to_pool(a, live),
        Literal::Bool(a) => to_pool(a, live),
    }
}

/// Starts a run on this thread whose live values and pooled buffers may hold `budget`
/// bytes together, `live` of them live now; frees pooled buffers beyond it. The pool
/// hands out buffers until the returned [`Run`] is dropped.
#[must_use = "the run ends when the guard is dropped"]
pub(crate) fn start_run(budget: usize, live: usize) -> Run {
    POOL.with_borrow_mut(|pool| {
        pool.budget = budget;
        pool.live = live;
        if live.saturating_add(pool.pooled) > budget {
            pool.clear();
        }
        Run {
            was_running: std::mem::replace(&mut pool.running, true),
        }
    })
}

/// A run on this thread (see [`start_run`]): while it lives, kernels take their
/// buffers from the pool.
#[derive(Debug)]
pub(crate) struct Run {
    /// Whether a run was going on when this one started (one run inside another).
    was_running: bool,
}

impl Drop for Run {
    fn drop(&mut self) {
        // A thread's pool may already be gone while the thread ends.
        let _ = POOL.try_with(|pool| {
            if let Ok(mut pool) = pool.try_borrow_mut() {
                pool.running = self.was_running;
            }
        });
    }
}

/// Tells this thread's pool that `live` bytes of values are live.
pub(crate) fn set_live(live: usize) {
    POOL.with_borrow_mut(|pool| pool.live = live);
}

/// Tells this thread's pool that `live` bytes of values are live, the node's new
/// results among them (one of `len` elements of `dtype` where the pool follows no
/// program), and frees pooled buffers until the live bytes, `scratch` bytes a kernel
/// may need besides and the pooled bytes fit the budget (sparing the buffers those
/// results may take): so memory stays within the budget when the results are not taken
/// from the pool. The node is at position `now` of the program
/// the pool follows (see [`follow`]).
pub(crate) fn reserve(live: usize, scratch: usize, dtype: DType, len: usize, now: usize) {
    POOL.with_borrow_mut(|pool| {
        pool.now = now;
        pool.reserve(live, scratch, (dtype, len));
    });
}

/// Tells this thread's pool that the program whose [`Requests`] these are runs now,
/// from its first node ([`reserve`] says which node it is at), until the returned
/// [`Following`] is dropped: then the pool follows what it followed before (the
/// enclosing program, for a region run by a flow node).
#[must_use = "the pool follows the requests until the guard is dropped"]
pub(crate) fn follow(requests: &Arc<Requests>) -> Following {
    POOL.with_borrow_mut(|pool| Following {
        before: pool.requests.replace(Arc::clone(requests)),
        now: std::mem::replace(&mut pool.now, 0),
    })
}

/// A program's [`Requests`] followed by the pool (see [`follow`]).
#[derive(Debug)]
pub(crate) struct Following {
    /// What the pool followed before, and where it was in it.
    before: Option<Arc<Requests>>,
    now: usize,
}

impl Drop for Following {
    fn drop(&mut self) {
        // A thread's pool may already be gone while the thread ends.
        let _ = POOL.try_with(|pool| {
            if let Ok(mut pool) = pool.try_borrow_mut() {
                pool.requests = self.before.take();
                pool.now = self.now;
            }
        });
    }
}

/// The bytes the pools of all threads hold: memory that is no live value (see the
/// module docs), for measurements of what a run allocates.
pub fn pooled_bytes() -> usize {
    POOLED.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` with a fresh pool of `budget` bytes, `live` of them live, on a thread of
    /// its own (the pool is per thread).
    fn on_fresh_thread(budget: usize, live: usize, f: impl FnOnce() + Send + 'static) {
        std::thread::spawn(move || {
            let _run = start_run(budget, live);
            f();
        })
        .join()
        .expect("no panic");
    }

    #[test]
    fn a_given_buffer_is_taken_again_by_dtype_and_length() {
        on_fresh_thread(1 << 20, 0, || {
            let a = take::<f32>(100);
            let address = a.as_ptr();
            give(Literal::F32(
                ArrayD::from_shape_vec(IxDyn(&[10, 10]), a).unwrap(),
            ));
            assert_eq!(POOL.with_borrow(|p| p.pooled), 400);
            // Another dtype or length does not take it.
            let (ints, shorter) = (take::<i32>(100), take::<f32>(99));
            assert_ne!(ints.as_ptr().cast(), address);
            assert_ne!(shorter.as_ptr(), address);
            let again = take_array::<f32>(&[4, 25]);
            assert_eq!(again.as_ptr(), address);
            assert_eq!(POOL.with_borrow(|p| p.pooled), 0);
        });
    }

    #[test]
    fn the_headroom_is_an_eighth_of_the_peak_at_least_the_least_within_the_memory_limit() {
        let peak = 16 * LEAST_HEADROOM;
        assert_eq!(headroom(peak, usize::MAX), 2 * LEAST_HEADROOM);
        assert_eq!(
            headroom(peak, peak + 50),
            50,
            "the limit leaves 50 bytes above the peak"
        );
        assert_eq!(headroom(peak, peak), 0);
        assert_eq!(
            headroom(peak, peak - 1),
            0,
            "a peak over the limit gets none"
        );
        assert_eq!(
            headroom(800, usize::MAX),
            LEAST_HEADROOM,
            "a small peak gets the least"
        );
        assert_eq!(headroom(800, 850), 50, "within the limit still");
    }

    #[test]
    fn the_pool_keeps_live_and_pooled_bytes_within_the_budget() {
        // 1000 bytes of budget, 600 live: room for 400 bytes of f32 (100 elements).
        on_fresh_thread(1000, 600, || {
            give(Literal::F32(ArrayD::zeros(IxDyn(&[100]))));
            give(Literal::F32(ArrayD::zeros(IxDyn(&[10]))));
            assert_eq!(POOL.with_borrow(|p| p.pooled), 400, "the second is freed");
            // A live value of 400 bytes released: it moves to the pool.
            release(Literal::F32(ArrayD::zeros(IxDyn(&[100]))));
            assert_eq!(POOL.with_borrow(|p| p.pooled), 800);
            // 900 live (the coming result's 400 among them) with 100 of scratch: the
            // pool keeps only one buffer of the result's length, for the result.
            reserve(900, 100, DType::F32, 100, 0);
            assert_eq!(POOL.with_borrow(|p| p.pooled), 400);
            assert_eq!(take::<f32>(100).len(), 100);
            reserve(900, 100, DType::F32, 100, 0);
            assert_eq!(POOL.with_borrow(|p| p.pooled), 0);
            set_live(200);
            give(Literal::F32(ArrayD::zeros(IxDyn(&[100]))));
            give(Literal::I32(ArrayD::zeros(IxDyn(&[100]))));
            reserve(300, 0, DType::I32, 100, 0);
            assert_eq!(
                POOL.with_borrow(|p| p.pooled),
                400,
                "the i32 buffer is spared"
            );
            assert_eq!(take::<i32>(100).len(), 100);
        });
    }

    /// Candidates of `bytes` each (f32 buffers, each of its own length).
    fn candidates(bytes: &[usize]) -> Vec<Candidate> {
        (bytes.iter().enumerate())
            .map(|(k, &bytes)| Candidate {
                shelf: 0,
                len: bytes / 4 + k,
                bytes,
                next: usize::MAX,
                taken: false,
            })
            .collect()
    }

    fn freed(bytes: &[usize], need: usize) -> Vec<usize> {
        let mut chosen = candidates(bytes);
        to_free(&mut chosen, need);
        let mut freed: Vec<usize> = chosen.iter().map(|c| c.bytes).collect();
        freed.sort_unstable();
        freed
    }

    #[test]
    fn a_reserve_frees_few_bytes_beyond_what_must_go() {
        // One buffer that covers the need, rather than the larger one.
        assert_eq!(freed(&[32, 8, 16], 10), [16]);
        // Smaller buffers that add up to it, rather than one much larger.
        assert_eq!(freed(&[400, 400, 4000], 700), [400, 400]);
        // One buffer, rather than the small ones topped up with it.
        assert_eq!(freed(&[32, 8, 8, 8, 4], 30), [32]);
        // The largest that fit, topped up with the smallest that covers the rest.
        assert_eq!(freed(&[32, 16, 8, 4], 22), [8, 16]);
        assert_eq!(freed(&[32, 16, 8, 4], 26), [4, 8, 16]);
        assert_eq!(freed(&[32, 16, 6, 6], 21), [6, 16]);
        // Not enough: all of them.
        assert_eq!(freed(&[8, 4], 20), [4, 8]);
        assert_eq!(freed(&[], 20), Vec::<usize>::new());
    }

    #[test]
    fn a_reserve_keeps_the_buffers_it_need_not_free() {
        // 32 KiB of budget, nothing live, buffers of 16, 4, 4 and 2 KiB pooled (26).
        on_fresh_thread(32 << 10, 0, || {
            for len in [4096, 1024, 1024, 512] {
                give(Literal::F32(ArrayD::zeros(IxDyn(&[len]))));
            }
            let pooled = || POOL.with_borrow(|p| p.pooled);
            assert_eq!(pooled(), 26 << 10);
            // 8 KiB must go (14 live and scratch): the two 4 KiB buffers, not the 16.
            reserve(10 << 10, 4 << 10, DType::I32, 1, 0);
            assert_eq!(pooled(), 18 << 10);
            let kept = take::<f32>(4096);
            assert_eq!(pooled(), 2 << 10, "the 16 KiB buffer was kept");
            drop(kept);
            // The result's length is spared even where freeing it would fit better.
            set_live(0);
            give(Literal::F32(ArrayD::zeros(IxDyn(&[1024]))));
            reserve((28 << 10) + 512, 0, DType::F32, 1024, 0);
            assert_eq!(
                pooled(),
                4 << 10,
                "the 2 KiB buffer went, the 4 KiB one stayed"
            );
        });
    }

    #[test]
    fn requests_say_how_far_ahead_a_buffer_is_asked_for_again() {
        let requests = Requests::new(
            10,
            [
                (7, DType::F32, 64),
                (2, DType::F32, 64),
                (5, DType::I32, 64),
            ],
        );
        assert_eq!(requests.next(DType::F32, 64, 0), 2);
        assert_eq!(
            requests.next(DType::F32, 64, 2),
            0,
            "asked for by this node"
        );
        assert_eq!(requests.next(DType::F32, 64, 3), 4);
        assert_eq!(requests.next(DType::F32, 64, 8), 4, "in the next run");
        assert_eq!(requests.next(DType::I32, 64, 6), 9);
        assert_eq!(requests.next(DType::F32, 63, 0), usize::MAX);
        assert_eq!(requests.next(DType::BF16, 64, 0), usize::MAX);
    }

    /// Gives back a zeroed f32 buffer of `len` elements that was not live.
    fn give_f32(len: usize) {
        give(Literal::F32(ArrayD::zeros(IxDyn(&[len]))));
    }

    fn pooled() -> usize {
        POOL.with_borrow(|p| p.pooled)
    }

    #[test]
    fn the_buffers_asked_for_farthest_ahead_go_first() {
        // Lengths 100 (400 bytes), 200 and 300: asked for at nodes 9, 3 and never.
        let requests = Arc::new(Requests::new(
            10,
            [(9, DType::F32, 100), (3, DType::F32, 200)],
        ));
        on_fresh_thread(4000, 0, move || {
            let _following = follow(&requests);
            give_f32(100);
            give_f32(200);
            give_f32(300);
            assert_eq!(pooled(), 2400);
            // 400 bytes must go: the 300 (never asked for again), though the 100 fits
            // exactly.
            reserve(2000, 0, DType::I32, 1, 1);
            assert_eq!(pooled(), 1200);
            assert_eq!(take::<f32>(200).len(), 200);
            assert_eq!(pooled(), 400, "the 200 was kept");
            // Past node 3, the 200 is next asked for in the next run (node 13), after
            // the 100 (node 9): given back over the budget, it is not kept.
            set_live(3400);
            POOL.with_borrow_mut(|p| p.now = 4);
            give_f32(200);
            assert_eq!(pooled(), 400, "the 200 asked for later than the pooled 100");
            // Before node 3, it is asked for sooner than the 100: it takes its place.
            set_live(3000);
            POOL.with_borrow_mut(|p| p.now = 2);
            give_f32(200);
            assert_eq!(pooled(), 800);
            assert!(POOL.with_borrow(|p| p.f32s.by_len.contains_key(&200)));
            assert!(!POOL.with_borrow(|p| p.f32s.by_len.contains_key(&100)));
            // Past node 3 again, the 100 is asked for sooner than the 200; but with 900
            // bytes over the budget the 200's 800 are too few: none goes, the 100 is
            // not kept.
            set_live(3700);
            POOL.with_borrow_mut(|p| p.now = 4);
            give_f32(100);
            assert_eq!(pooled(), 800);
            assert!(!POOL.with_borrow(|p| p.f32s.by_len.contains_key(&100)));
        });
    }

    #[test]
    fn recycled_outputs_serve_the_next_run() {
        // 2000 bytes of budget, the two outputs of the last run (800 bytes) live.
        on_fresh_thread(2000, 800, || {
            recycle([0, 1].map(|_| Literal::F32(ArrayD::zeros(IxDyn(&[100])))));
            assert_eq!(pooled(), 800);
            assert_eq!(POOL.with_borrow(|p| p.live), 0, "no longer counted as live");
            assert_eq!(take::<f32>(100).len(), 100);
            assert_eq!(pooled(), 400, "a take of their length is served by one");
        });
    }

    #[test]
    fn a_reserve_spares_every_buffer_the_node_asks_for() {
        // A fusion root at node 2 asks for three buffers of 100 f32s (an AdamW update's
        // weight, first and second moments); a buffer of 50 is asked for at node 6.
        let requests = Arc::new(Requests::new(
            10,
            [
                (2, DType::F32, 100),
                (2, DType::F32, 100),
                (2, DType::F32, 100),
                (6, DType::F32, 50),
            ],
        ));
        assert_eq!(
            requests.of(2).collect::<Vec<_>>(),
            [(DType::F32, 100); 3],
            "the node's requests, one per buffer"
        );
        assert_eq!(requests.of(3).count(), 0);
        on_fresh_thread(2000, 0, move || {
            let _following = follow(&requests);
            for len in [100, 100, 100, 50] {
                give_f32(len);
            }
            assert_eq!(pooled(), 1400);
            // The three results live (1200 bytes) and 400 more: 1000 must go, but only
            // the 50's 200 may; the three of 100 stay for the results to take.
            reserve(1600, 0, DType::F32, 100, 2);
            assert_eq!(pooled(), 1200);
            for _ in 0..3 {
                assert_eq!(take::<f32>(100).len(), 100);
            }
            assert_eq!(pooled(), 0, "each result took a pooled buffer");
        });
    }

    #[test]
    fn without_requests_a_buffer_over_the_budget_is_not_kept() {
        on_fresh_thread(1000, 600, || {
            give_f32(50);
            give_f32(100);
            assert_eq!(pooled(), 200, "the 100 does not fit beside the 50");
        });
    }

    #[test]
    fn buffers_are_handed_out_only_during_a_run() {
        std::thread::spawn(|| {
            let run = start_run(1 << 20, 0);
            give(Literal::F32(ArrayD::zeros(IxDyn(&[64]))));
            drop(run);
            // A kernel between runs (a test's oracle, say) leaves the buffer alone...
            assert_eq!(take::<f32>(64).len(), 64);
            assert_eq!(POOL.with_borrow(|p| p.pooled), 256);
            // ...for the next run.
            let _run = start_run(1 << 20, 0);
            assert_eq!(take::<f32>(64).len(), 64);
            assert_eq!(POOL.with_borrow(|p| p.pooled), 0);
        })
        .join()
        .expect("no panic");
    }

    #[test]
    fn with_capacity_is_empty_with_room() {
        on_fresh_thread(1 << 20, 0, || {
            give(Literal::F32(ArrayD::zeros(IxDyn(&[64]))));
            let v = with_capacity::<f32>(64);
            assert!(v.is_empty() && v.capacity() >= 64);
            assert_eq!(POOL.with_borrow(|p| p.pooled), 0);
        });
    }

    /// New buffers of 16 KiB and more span 512 bytes past a multiple of the page with
    /// the allocator's header and rounding, so buffers allocated in a row start 0 or at
    /// least 512 bytes apart modulo the page (see [`staggered`]); their length is what
    /// was asked, their padding less than a page; smaller ones are not padded.
    #[test]
    fn new_buffers_are_staggered_over_the_page() {
        for (len, size) in [
            (4096, 4),
            (4097, 4),
            (16 * 1024, 2),
            (300_000, 4),
            (20_000, 1),
        ] {
            let cap = match size {
                4 => staggered::<f32>(len),
                2 => staggered::<bf16>(len),
                _ => staggered::<bool>(len),
            };
            let span = (cap * size + 8).next_multiple_of(16);
            assert_eq!(span % PAGE, STAGGER, "{len} elements of {size} bytes");
            assert!(cap >= len && (cap - len) * size < PAGE);
        }
        assert_eq!(staggered::<f32>(1000), 1000);
        let buffer = take::<f32>(8192);
        assert_eq!(buffer.len(), 8192);
        assert_eq!(buffer.capacity(), staggered::<f32>(8192));
        assert!(buffer.iter().all(|&v| v == 0.0));
        assert_eq!(
            with_capacity::<f32>(8192).capacity(),
            staggered::<f32>(8192)
        );
    }
}
