#include <ibev/core/object_handlers.h>

#include <utility>

namespace ibev::detail {

void ObjectHandlers::add(const ObjectKey& key, std::shared_ptr<Subscriber> subscriber) {
  Shard& shard = shard_for(key);
  std::lock_guard<std::mutex> lock(shard.mutex);
  std::shared_ptr<const SubscriberList>* several = shard.several.find(key);
  std::shared_ptr<Subscriber>& only = shard.objects[key];
  SubscriberList next;
  if (only) {
    next.push_back(only);
  } else if (several != nullptr) {
    next = **several;
  } else {
    only = std::move(subscriber);
    return;
  }
  next.push_back(std::move(subscriber));
  shard.several[key] = std::make_shared<const SubscriberList>(std::move(next));
  only.reset();  // another table: `only` still names its slot
}

void ObjectHandlers::remove(const ObjectKey& key, const Subscriber* subscriber) {
  Shard& shard = shard_for(key);
  std::lock_guard<std::mutex> lock(shard.mutex);
  std::shared_ptr<Subscriber>* only = shard.objects.find(key);
  if (only == nullptr) return;
  if (*only) {
    if (only->get() == subscriber) shard.objects.erase(key);
    return;
  }
  std::shared_ptr<const SubscriberList>* several = shard.several.find(key);
  if (several == nullptr) return;
  SubscriberList rest;
  for (const auto& s : **several) {
    if (s.get() != subscriber) rest.push_back(s);
  }
  if (rest.size() == 1) {
    *only = rest.front();
    shard.several.erase(key);
  } else {
    *several = std::make_shared<const SubscriberList>(std::move(rest));
  }
}

HandlerSet ObjectHandlers::find(const ObjectKey& key) {
  Shard& shard = shard_for(key);
  std::lock_guard<std::mutex> lock(shard.mutex);
  const std::shared_ptr<Subscriber>* only = shard.objects.find(key);
  if (only == nullptr) return {};
  if (*only) return {*only, nullptr};
  const std::shared_ptr<const SubscriberList>* several = shard.several.find(key);
  return {nullptr, several != nullptr ? *several : nullptr};
}

}  // namespace ibev::detail
