// What every CheckpointReader does unless it knows better (torchdefer/materialize.h).
#include <torchdefer/materialize.h>

namespace torchdefer {

void CheckpointReader::read_all(const std::vector<CheckpointRead>& reads) const {
  for (const CheckpointRead& r : reads) {
    read(r.name, r.box, r.out);
  }
}

}  // namespace torchdefer
