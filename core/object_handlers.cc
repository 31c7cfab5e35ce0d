#include <ibev/core/object_handlers.h>

#include <utility>

namespace ibev::detail {

void ObjectHandlers::add(const ObjectKey& key, std::shared_ptr<Subscriber> subscriber) {
  Shard& shard = shard_for(key);
  std::lock_guard<std::mutex> lock(shard.mutex);
  HandlerSet& set = shard.objects[key];
  if (!set.only && !set.several) {
    set.only = std::move(subscriber);
    return;
  }
  SubscriberList next;
  if (set.only) {
    next.push_back(std::move(set.only));
  } else {
    next = *set.several;
  }
  next.push_back(std::move(subscriber));
  set.several = std::make_shared<const SubscriberList>(std::move(next));
}

void ObjectHandlers::remove(const ObjectKey& key, const Subscriber* subscriber) {
  Shard& shard = shard_for(key);
  std::lock_guard<std::mutex> lock(shard.mutex);
  HandlerSet* set = shard.objects.find(key);
  if (set == nullptr) return;
  if (set->only) {
    if (set->only.get() == subscriber) shard.objects.erase(key);
    return;
  }
  SubscriberList rest;
  for (const auto& s : *set->several) {
    if (s.get() != subscriber) rest.push_back(s);
  }
  if (rest.size() == 1) {
    *set = HandlerSet{rest.front(), nullptr};
  } else {
    set->several = std::make_shared<const SubscriberList>(std::move(rest));
  }
}

HandlerSet ObjectHandlers::find(const ObjectKey& key) {
  Shard& shard = shard_for(key);
  std::lock_guard<std::mutex> lock(shard.mutex);
  const HandlerSet* set = shard.objects.find(key);
  return set != nullptr ? *set : HandlerSet{};
}

}  // namespace ibev::detail
