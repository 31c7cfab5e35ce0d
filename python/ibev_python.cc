// ibev._ibev: the native half of the Python module `ibev` (pybind11 over the
// C++ API; python/ibev/__init__.py adds asyncio on top).
//
// The module itself: its version, what a C++ std::system_error becomes, the
// constants; its classes and functions are its rooms' (python/bindings.h
// lists them, with the GIL's rules every wrapper is shaped by).
#include "bindings.h"

#include <exception>
#include <string>
#include <system_error>

#include <ibev/core/event_type.h>
#include <ibev/version.h>

PYBIND11_MODULE(_ibev, m) {
  using namespace ibev;
  using namespace ibev::python;
  m.doc() = "ibev: RDMA async events with the kernel's event model (native part)";
  m.attr("__version__") = IBEV_VERSION_STRING;

  // OSError(errno, text) for what C++ throws as std::system_error: the
  // errno stays readable (e.errno == errno.ENODEV).
  py::register_exception_translator([](std::exception_ptr thrown) {
    try {
      if (thrown) std::rethrow_exception(thrown);
    } catch (const std::system_error& e) {
      py::object error = py::reinterpret_steal<py::object>(
          PyObject_CallFunction(PyExc_OSError, "is", e.code().value(), e.what()));
      PyErr_SetObject(PyExc_OSError, error.ptr());
    }
  });

  // The event codes, from the one table of them.
  for (const EventTypeInfo& info : kEventTypes) {
    m.attr(std::string(info.enumerator).c_str()) = static_cast<int>(info.type);
  }
  m.attr("IBV_ACCESS_LOCAL_WRITE") = static_cast<int>(IBV_ACCESS_LOCAL_WRITE);
  m.attr("IBV_ACCESS_REMOTE_WRITE") = static_cast<int>(IBV_ACCESS_REMOTE_WRITE);
  m.attr("IBV_ACCESS_REMOTE_READ") = static_cast<int>(IBV_ACCESS_REMOTE_READ);
  m.attr("IBV_WC_SUCCESS") = static_cast<int>(IBV_WC_SUCCESS);
  m.attr("IBV_WC_WR_FLUSH_ERR") = static_cast<int>(IBV_WC_WR_FLUSH_ERR);
  m.attr("IBV_WC_SEND") = static_cast<int>(IBV_WC_SEND);
  m.attr("IBV_WC_RECV") = static_cast<int>(IBV_WC_RECV);

  bind_dispatcher(m);
  bind_verbs(m);
  bind_waiting(m);
  bind_health(m);
  bind_cm(m);
}
