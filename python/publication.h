// The Python binding of publication (issue #37): ckpt._ckpt.publish and
// subscribe, Subscriber, PublishedVersion and VersionView (an item mapped
// without a copy, a Python buffer that keeps its version open). The Python
// side is python/ckpt/torch/subscriber.py.
//
// Thread-safety: as pybind11 calls them, with the GIL; waits release it.
#ifndef CKPT_PYTHON_PUBLICATION_H_
#define CKPT_PYTHON_PUBLICATION_H_

#include <pybind11/pybind11.h>

#include "proto/publish.pb.h"

namespace ckpt::python {

// A version's record as a dict.
pybind11::dict VersionDict(const proto::VersionRecord& v);

// Adds publication's functions and classes to the module.
void BindPublication(pybind11::module_& m);

}  // namespace ckpt::python

#endif  // CKPT_PYTHON_PUBLICATION_H_
