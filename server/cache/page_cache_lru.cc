// PageCache: the LRU list of evictable entries and the per-entry state
// that decides who is on it (references, cached children).
#include "server/cache/page_cache.h"
#include "server/cache/page_cache_entry.h"

namespace hostkv {

bool PageCache::Evictable(const Entry& e) {
  return e.refs == 0 && e.children == 0;
}

void PageCache::LinkHot(uint32_t page) {
  Entry& e = At(page);
  e.colder = hottest_;
  e.hotter = kNone;
  if (hottest_ != kNone) {
    At(hottest_).hotter = page;
  } else {
    coldest_ = page;
  }
  hottest_ = page;
}

void PageCache::LinkCold(uint32_t page) {
  Entry& e = At(page);
  e.hotter = coldest_;
  e.colder = kNone;
  if (coldest_ != kNone) {
    At(coldest_).colder = page;
  } else {
    hottest_ = page;
  }
  coldest_ = page;
}

void PageCache::Unlink(uint32_t page) {
  Entry& e = At(page);
  if (e.colder != kNone) {
    At(e.colder).hotter = e.hotter;
  } else {
    coldest_ = e.hotter;
  }
  if (e.hotter != kNone) {
    At(e.hotter).colder = e.colder;
  } else {
    hottest_ = e.colder;
  }
}

void PageCache::Touch(uint32_t page) {
  Entry& e = At(page);
  e.last_use = ++clock_;
  if (Evictable(e) && page != hottest_) {
    Unlink(page);
    LinkHot(page);
  }
}

void PageCache::AddRef(uint32_t page, SessionRefs& held) {
  Entry& e = At(page);
  if (e.refs++ == 0) {
    Count(e.ns, &CacheCounters::referenced, 1);
    if (e.children == 0) {
      Unlink(page);
      Count(e.ns, &CacheCounters::evictable, -1);
    }
  }
  ++total_refs_;
  ++held.by_page[page];
  ++held.total;
}

void PageCache::DropRefs(uint32_t page, uint32_t count) {
  Entry& e = At(page);
  e.refs -= count;
  total_refs_ -= count;
  if (e.refs == 0) {
    Count(e.ns, &CacheCounters::referenced, -1);
    e.last_use = ++clock_;
    if (e.children == 0) {
      // A detached page (a digest mismatch) goes before any other.
      if (e.detached()) {
        LinkCold(page);
      } else {
        LinkHot(page);
      }
      Count(e.ns, &CacheCounters::evictable, 1);
    }
  }
}

void PageCache::AddChild(uint32_t parent) {
  Entry& p = At(parent);
  if (Evictable(p)) {
    Unlink(parent);
    Count(p.ns, &CacheCounters::evictable, -1);
  }
  ++p.children;
}

void PageCache::DropChild(uint32_t parent) {
  Entry& p = At(parent);
  if (--p.children > 0 || p.refs > 0) return;
  Count(p.ns, &CacheCounters::evictable, 1);
  // Its sorted place when the parent was used no later than the coldest
  // page: the cold end; else the hot end (used recently, if not last). A
  // detached one (a digest mismatch): the cold end.
  if (coldest_ == kNone || p.detached() || p.last_use <= At(coldest_).last_use) {
    LinkCold(parent);
  } else {
    LinkHot(parent);
  }
}

}  // namespace hostkv
