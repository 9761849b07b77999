// hostkv client library: what an inference engine links to use hostkvd.
//
//   auto client = hostkv::Client::Connect("unix:/run/hostkv/hostkvd.sock",
//                                         "engine-rank0");
//   auto pool = (*client)->CreatePool(spec);            // or attach
//   auto import = (*client)->RegisterDeviceBuffers(...);
//   auto pages = (*client)->Alloc("llama", 64);         // host slots
//   auto op = (*client)->Backup("llama", *import, *pages, device_slots);
//   (*client)->Wait(*op);                               // or WaitLayer
//
// Every call returns absl::Status / StatusOr with the daemon's code and
// message. A Client owns one session; everything it allocates or registers
// is released when it is destroyed (or Close()d). Thread-safe.
#ifndef HOSTKV_CLIENT_INCLUDE_HOSTKV_CLIENT_H_
#define HOSTKV_CLIENT_INCLUDE_HOSTKV_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hostkv/v1/hostkv.pb.h"

namespace hostkv {

// The default daemon address.
inline constexpr char kDefaultTarget[] = "unix:/run/hostkv/hostkvd.sock";

// Host pages [first_page, first_page + num_pages).
struct PageRange {
  uint64_t first_page = 0;
  uint64_t num_pages = 0;
};

// Device token slots [first_slot, first_slot + num_slots).
struct SlotRange {
  uint64_t first_slot = 0;
  uint64_t num_slots = 0;
};

// A submitted load or backup.
struct Operation {
  uint64_t op_id = 0;
  uint32_t signal_index = 0;
  uint32_t layer_begin = 0;
  uint32_t num_layers = 0;
  uint64_t num_tokens = 0;
  uint64_t bytes = 0;
  // CUDA imports with GPU signals: the value each layer's signal word takes
  // once that layer is copied (GpuSignals::WaitLayer waits for it).
  uint64_t signal_value = 0;
  // The signal segment of the daemon that answered the submission
  // (TransferResponse.signal_segment_id): the operation is waited for in its
  // records only. If that daemon went away before finishing it, the session's
  // resume submits it again and WaitLayer waits for that submission.
  uint64_t signal_segment = 0;
};

struct TransferOptions {
  uint32_t layer_begin = 0;
  uint32_t layer_end = 0;  // 0: every layer
  v1::CopyMechanism mechanism = v1::MECHANISM_UNSPECIFIED;
  // CUDA loads and backups: start once the import's "KV written" mark word
  // reaches this value (GpuSignals::MarkKvWritten returns it); 0 = at once.
  // A load uses it to wait until the compute stream no longer reads the
  // slots it overwrites.
  uint64_t wait_kv_written = 0;
  // Any import: the signal record moves once, when every layer is copied
  // (a waiter for the whole operation wakes once, not once per layer).
  bool progress_at_end = false;
};

// The page cache (server/README.md, "The page cache"). Keys and namespaces are opaque
// bytes: a key of 1..64 bytes names a page's content (e.g. SGLang's chained
// page hash) inside a namespace of 1..128 bytes the engine chooses.
struct CacheItem {
  std::string key;
  // The key of the page before this one, or empty: a parent is evicted only
  // after its cached children.
  std::string parent_key;
  uint64_t page = 0;  // a host page the session owns
};

// What Publish did with one item.
struct PublishedPage {
  v1::PublishOutcome outcome = v1::PUBLISH_OUTCOME_UNSPECIFIED;
  // The page cached under the item's key: the item's own page
  // (PUBLISH_CACHED, PUBLISH_CONFLICT) or the one already cached and kept
  // (PUBLISH_ALREADY_CACHED; the item's page stays the caller's).
  uint64_t page = 0;
};

struct PublishOutcomes {
  std::vector<PublishedPage> items;  // one per item, in item order
  uint64_t cached = 0;               // items PUBLISH_CACHED
  uint64_t already_cached = 0;       // items PUBLISH_ALREADY_CACHED
};

// The longest cached prefix of the keys a Lookup was given.
struct LookupResult {
  uint64_t hits = 0;  // keys, from the first, that are cached
  // Their pages, one per hit in key order, as runs of consecutive pages.
  std::vector<PageRange> pages;
};

// Keys of a namespace the cache evicted, from a cursor (ListEvictions).
struct EvictedKeys {
  std::vector<std::string> keys;  // in eviction order
  uint64_t next = 0;              // pass as `after` next time
  // Evictions (of any namespace of the pool) that left the daemon's log
  // before they were read.
  uint64_t missed = 0;
};

struct CopyPagesResult {
  uint64_t pages = 0;
  uint64_t bytes = 0;
};

struct ConnectOptions {
  // Sent as "authorization: Bearer <auth_token>" when not empty.
  std::string auth_token;
  // On a unix: target, a call that finds hostkvd away (UNAVAILABLE, or
  // CANCELLED by a daemon draining for an upgrade) waits for it this long,
  // each try going out as soon as the daemon listens again, and resumes the
  // session when a daemon that adopted the previous one's state answers (it
  // registers the imports and passes the descriptors again, keeping their
  // ids, and submits again the loads and backups the previous daemon had not
  // finished, before any other call of this client reaches the new one);
  // then the call is made again. 0: no wait, no resume. server/README.md
  // "While hostkvd is away".
  absl::Duration reconnect_timeout = absl::Seconds(30);
};

class Client {
 public:
  // Connects to `target` ("unix:PATH" or "HOST:PORT") and opens a session
  // named `client_name`. On a Unix socket the session is opened over the
  // session socket: it is bound to this process's uid, and ends by itself
  // if this process dies; over TCP a background thread renews the
  // session's lease. Returns Unavailable if the daemon cannot be reached,
  // ResourceExhausted at one of the daemon's per-user limits.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const std::string& target, const std::string& client_name,
      const ConnectOptions& options = {});

  ~Client();  // Close()s the session if still open.
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // The session's 16-byte secret. Keep it in this process.
  const std::string& session_id() const;
  // The session's public number (stats, HandOverPages).
  uint32_t session_number() const;
  // Calls answered through the session's command ring so far (Alloc,
  // Free, Load, Backup, Lookup, Release, Publish go through it on a unix:
  // target whose daemon serves one, unless HOSTKV_COMMAND_RING=0); -1
  // without a ring: every call goes over gRPC.
  int64_t CommandRingCalls() const;

  // Creates a pool; with attach_if_exists, an existing pool with the same
  // spec is returned instead of AlreadyExists. With delete_with_session a
  // pool this call creates is deleted when this session ends (if no other
  // session holds pages or buffers in it then).
  absl::StatusOr<v1::Pool> CreatePool(const v1::PoolSpec& spec,
                                      bool attach_if_exists = true,
                                      bool delete_with_session = false);
  absl::StatusOr<v1::Pool> GetPool(const std::string& name);
  absl::StatusOr<std::vector<v1::Pool>> ListPools();
  absl::Status DeletePool(const std::string& name);

  // Registers the device KV buffers of `pool`: k[l] and v[l] per layer (v
  // empty for MLA), each with token_slots rows: shared-memory buffers
  // (ShmDeviceBuffer, CPU backend) or CUDA memory (ExportCudaBuffer in
  // hostkv/cuda_buffers.h). `gpu_signals` (CUDA only, may be null) are the
  // import's GPU completion words (GpuSignals::buffer()). Returns the import
  // id.
  absl::StatusOr<uint64_t> RegisterDeviceBuffers(
      const std::string& pool, uint64_t token_slots,
      const std::vector<v1::DeviceBuffer>& k,
      const std::vector<v1::DeviceBuffer>& v,
      const v1::DeviceBuffer* gpu_signals = nullptr);
  absl::Status UnregisterDeviceBuffers(uint64_t import_id);

  // Hands the daemon `fd`, a memfd sealed against shrinking
  // (ShmDeviceBuffer::CreateSealed makes one), over the session socket;
  // returns the handle that DeviceBuffer.passed_fd names it by. The safe
  // form of shared-memory device buffers: no name anyone could open, and
  // no truncation under the daemon's copies. Unix targets only
  // (FailedPrecondition over TCP); InvalidArgument for an unsealed fd.
  absl::StatusOr<uint64_t> PassDescriptor(int fd);

  // Fetches, over the session socket, the memfd of the "KV written" page
  // of CUDA import `import_id` (registered with gpu_signals); the caller
  // owns the returned descriptor. GpuSignals::AttachKvWord does this for
  // you. NotFound for an unknown import, FailedPrecondition for an import
  // without gpu_signals or over a TCP target.
  absl::StatusOr<int> FetchKvWord(uint64_t import_id);

  // A descriptor of pool `pool`'s shared-memory segment (its host pages,
  // laid out as Pool describes), fetched over the session socket: the
  // caller owns `fd` and maps it (read-write only if `writable`). Writable
  // for the pool's owner uid and root, read-only for other sessions the
  // pool admits. PermissionDenied if the pool does not admit the session;
  // NotFound; FailedPrecondition over a TCP target.
  struct PoolSegment {
    int fd = -1;
    bool writable = false;
  };
  absl::StatusOr<PoolSegment> FetchPoolSegment(const std::string& pool);

  // Allocates num_tokens host slots (a multiple of the page size).
  absl::StatusOr<std::vector<PageRange>> Alloc(const std::string& pool,
                                               uint64_t num_tokens);
  // While the pool is still being made resident (PoolStats.fill_state):
  // wait up to fill_wait_ms for its pages (0: the daemon's --pool_fill_wait),
  // then DeadlineExceeded; or with fill_no_wait, FailedPrecondition at once.
  struct AllocOptions {
    uint32_t fill_wait_ms = 0;
    bool fill_no_wait = false;
  };
  absl::StatusOr<std::vector<PageRange>> Alloc(const std::string& pool,
                                               uint64_t num_tokens,
                                               const AllocOptions& options);
  // Frees pages; returns how many were freed.
  absl::StatusOr<uint64_t> Free(const std::string& pool,
                                const std::vector<PageRange>& pages);
  // Gives pages to the session numbered `to_session_number`; returns how
  // many moved.
  absl::StatusOr<uint64_t> HandOverPages(const std::string& pool,
                                         const std::vector<PageRange>& pages,
                                         uint32_t to_session_number);

  // Host pages -> device slots (load) or back (backup); returns once the
  // daemon has enqueued the copies.
  absl::StatusOr<Operation> Load(const std::string& pool, uint64_t import_id,
                                 const std::vector<PageRange>& host_pages,
                                 const std::vector<SlotRange>& device_slots,
                                 const TransferOptions& options = {});
  absl::StatusOr<Operation> Backup(const std::string& pool, uint64_t import_id,
                                   const std::vector<PageRange>& host_pages,
                                   const std::vector<SlotRange>& device_slots,
                                   const TransferOptions& options = {});

  // Blocks until layer `layer` (an absolute layer index) of `op` is copied,
  // reading the signal records of the daemon that ran it, without calling
  // the daemon (unless it went away meanwhile: then the call that waits for
  // the next one resumes the session, which submits `op` again, and this
  // waits for that). (CUDA imports publish each layer to the host too;
  // GpuSignals::WaitLayer waits per layer on a CUDA stream instead, without
  // the host.) InvalidArgument if `op` does not cover the layer or is not
  // this client's; Aborted if the daemon abandoned the operation (or it was
  // in flight in a daemon that went away and the client kept no record of
  // it: submit it again); DeadlineExceeded.
  absl::Status WaitLayer(const Operation& op, uint32_t layer,
                         absl::Duration timeout = absl::Seconds(60));
  // Blocks until every layer of `op` is copied.
  absl::Status Wait(const Operation& op,
                    absl::Duration timeout = absl::Seconds(60));

  // Pages in SGLang's flat page format, concatenated.
  absl::StatusOr<std::string> ReadPages(const std::string& pool,
                                        const std::vector<PageRange>& pages);
  absl::Status WritePages(const std::string& pool,
                          const std::vector<PageRange>& pages,
                          const std::string& data);
  absl::StatusOr<v1::GetPageBufferMetaResponse> GetPageBufferMeta(
      const std::string& pool, const std::vector<PageRange>& pages);

  // Publishes pages of the session in `pool` under keys of namespace
  // `cache_namespace`, in item order (an item may name an earlier one as its
  // parent). A PUBLISH_CACHED page becomes the cache's: no longer the
  // session's to write, free or hand over, and kept after the session ends.
  // With `acquire`, the session also gets a reference on the page cached
  // under each key (CACHED and ALREADY_CACHED items), so that it can load it
  // at once and it is not evicted until Release. All or nothing on bad
  // input: InvalidArgument (namespace, key, page out of range),
  // FailedPrecondition (a page the session does not own, e.g. cached
  // already), PermissionDenied (a namespace of another uid),
  // ResourceExhausted (namespace or reference limits), DeadlineExceeded (a
  // backup into a page still running past the daemon's wait).
  absl::StatusOr<PublishOutcomes> Publish(const std::string& pool,
                                          const std::string& cache_namespace,
                                          const std::vector<CacheItem>& items,
                                          bool acquire = false);
  // Finds the longest cached prefix of `keys` in `cache_namespace`. With
  // `acquire` the session gets a reference on each page found (a key listed
  // twice: two), which Load, CopyPages and ReadPages need and which keeps
  // the page from eviction; without it the pages may be evicted at any
  // time. A namespace nothing was published in finds nothing.
  // InvalidArgument (no keys, a key of 0 or more than 64 bytes),
  // PermissionDenied (a namespace of another uid), NotFound (pool).
  absl::StatusOr<LookupResult> Lookup(const std::string& pool,
                                      const std::string& cache_namespace,
                                      const std::vector<std::string>& keys,
                                      bool acquire = false);
  // Drops one of the session's references per page listed (a page listed
  // twice: two); returns how many were dropped. All or nothing:
  // FailedPrecondition, releasing nothing, for a page the session holds too
  // few references on.
  absl::StatusOr<uint64_t> Release(const std::string& pool,
                                   const std::vector<PageRange>& pages);
  // The keys of `cache_namespace` the cache evicted after eviction number
  // `after` (up to max_keys, at most 65,536; 0: none, and `next` is the
  // current number, to start "from now"). Access as Lookup.
  absl::StatusOr<EvictedKeys> ListEvictions(const std::string& pool,
                                            const std::string& cache_namespace,
                                            uint64_t after, uint32_t max_keys = 2048);
  // Why lookups of `cache_namespace` miss: each key cached now or why not,
  // the namespace's latest misses (at most max_recent, newest first), its
  // lookup counters and a hint when its lookups and publishes never meet.
  absl::StatusOr<v1::ExplainMissesResponse> ExplainMisses(
      const std::string& pool, const std::string& cache_namespace,
      const std::vector<std::string>& keys, uint32_t max_recent = 10);
  // Copies page i of `from` into page i of `to` inside the daemon (every
  // layer, the pool's layout) and returns once the bytes are copied. `from`:
  // cached pages the session references, or pages it owns; `to`: pages it
  // owns with no copy in flight. InvalidArgument for unequal totals, a page
  // listed twice or overlapping lists; FailedPrecondition for a page the
  // session may not read or write.
  absl::StatusOr<CopyPagesResult> CopyPages(const std::string& pool,
                                            const std::vector<PageRange>& from,
                                            const std::vector<PageRange>& to);

  // Occupancy of one pool, or of every pool when `pool` is empty.
  absl::StatusOr<v1::GetPoolStatsResponse> GetPoolStats(
      const std::string& pool = "");

  // Closes the session: the daemon frees its pages and imports.
  absl::Status Close();

  // Runs `fn` once, on a thread of the client's, if the session socket hangs
  // up while the session is open: the daemon died or ended the session. An
  // engine with GPU signals passes GpuSignals::ReleaseAll here, since no
  // word its streams wait on would move again. Not run for Close() or the
  // destructor. FailedPrecondition over TCP (no session socket) or when
  // called a second time.
  absl::Status OnDaemonLost(std::function<void()> fn);

 private:
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  absl::StatusOr<Operation> Transfer(bool load, const std::string& pool,
                                     uint64_t import_id,
                                     const std::vector<PageRange>& host_pages,
                                     const std::vector<SlotRange>& device_slots,
                                     const TransferOptions& options);
  std::unique_ptr<Impl> impl_;
};

// Asks the daemon's grpc.health.v1 service about `service` ("" = the whole
// daemon, "hostkv.v1.HostKV" = the API) without opening a session. Returns
// true if SERVING; Unavailable if the daemon cannot be reached.
absl::StatusOr<bool> CheckHealth(const std::string& target,
                                 const std::string& service = "",
                                 const ConnectOptions& options = {});

// The pages of `items` that Publish left to the caller (PUBLISH_ALREADY_CACHED:
// the key was cached with another page): still the session's, to free or
// reuse. `outcomes` is what Publish returned for `items`.
std::vector<PageRange> PagesNotCached(const std::vector<CacheItem>& items,
                                      const PublishOutcomes& outcomes);

// Tokens covered by `pages` in a pool of `page_size`.
uint64_t CountTokens(const std::vector<PageRange>& pages, uint32_t page_size);

}  // namespace hostkv

#endif  // HOSTKV_CLIENT_INCLUDE_HOSTKV_CLIENT_H_
