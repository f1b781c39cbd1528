// holdfast compatibility shim, used only when the system's Gloo headers lack
// gloo/common/memory.h (Debian bookworm's libgloo-dev 0.0~git20220518 ships
// transport/tcp/pair.h, which includes it, without it).
//
// The three smart-pointer wrappers below match the layout libgloo was built
// with: each holds exactly one std::shared_ptr or std::weak_ptr. holdfast
// never creates or destroys these objects itself; it only needs the type
// definitions so that tcp::Pair's declaration (peer(),
// signalExceptionExternal()) compiles. Written for holdfast.
#pragma once

#include <memory>
#include <thread>

namespace gloo {

template <typename T>
class WeakNonOwningPtr;
template <typename T>
class ShareableNonOwningPtr;

// A short-lived strong reference obtained from a WeakNonOwningPtr.
template <typename T>
class NonOwningPtr final {
 public:
  NonOwningPtr() = default;
  explicit NonOwningPtr(const WeakNonOwningPtr<T>& weak)
      : ref_(weak.ref_.lock()) {}
  T* operator->() const noexcept { return ref_.get(); }
  explicit operator bool() const noexcept { return ref_ != nullptr; }

 private:
  std::shared_ptr<T> ref_;
};

// A weak reference handed out by a ShareableNonOwningPtr.
template <typename T>
class WeakNonOwningPtr final {
 public:
  WeakNonOwningPtr() = default;
  explicit WeakNonOwningPtr(const ShareableNonOwningPtr<T>& root)
      : ref_(root.ref_) {}
  // True if this was ever bound to an object (even one gone since).
  explicit operator bool() const noexcept {
    const std::weak_ptr<T> empty;
    return ref_.owner_before(empty) || empty.owner_before(ref_);
  }

 protected:
  std::weak_ptr<T> ref_;
  friend class NonOwningPtr<T>;
};

// The root reference to an object that does not own it; its destructor
// waits until no NonOwningPtr to the object is alive.
template <typename T>
class ShareableNonOwningPtr final {
 public:
  explicit ShareableNonOwningPtr(T* object) : ref_(object, [](T*) {}) {}
  ShareableNonOwningPtr(const ShareableNonOwningPtr&) = delete;
  ShareableNonOwningPtr& operator=(const ShareableNonOwningPtr&) = delete;
  ~ShareableNonOwningPtr() {
    std::weak_ptr<T> watch(ref_);
    ref_.reset();
    while (!watch.expired()) std::this_thread::yield();
  }

 protected:
  std::shared_ptr<T> ref_;
  friend class WeakNonOwningPtr<T>;
};

}  // namespace gloo
