// open_weight_source(): what each kind of path opens, and the errors for the rest.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "test_util.h"
#include "tpreload/checkpoint/writers.h"

namespace tpreload {
namespace {

using test::TempDir;

std::vector<test::OwnedTensor> two_tensors() {
  return {test::random_tensor("a.w", DType::kFloat32, {2, 2}),
          test::random_tensor("b.w", DType::kInt8, {3})};
}

TEST(OpenWeightSource, DispatchesOnWhatThePathNames) {
  TempDir dir;
  const auto tensors = two_tensors();
  write_safetensors(dir / "one.safetensors", test::as_memory(tensors));
  write_safetensors_sharded(dir / "sharded", test::as_memory(tensors), 2);
  write_hdf5(dir / "m.h5", test::as_memory(tensors));
  ::mkdir((dir / "h5dir").c_str(), 0755);
  write_hdf5(dir / "h5dir/model.hdf5", test::as_memory(tensors));
  ::rename((dir / "m.h5").c_str(), (dir / "no_extension").c_str());
  for (const std::string p : {"one.safetensors", "sharded", "sharded/model.safetensors.index.json",
                              "h5dir", "h5dir/model.hdf5", "no_extension"}) {
    auto source = open_weight_source(dir / p);
    test::expect_same_tensors(*source, tensors);
  }
  EXPECT_NE(open_weight_source(dir / "sharded")->describe().find("sharded"), std::string::npos);
}

TEST(OpenWeightSource, ErrorsForAnythingElse) {
  TempDir dir;
  EXPECT_EQ(test::error_of([&] { open_weight_source(dir / "missing"); }),
            "checkpoint '" + (dir / "missing") + "': no such file or directory");
  EXPECT_EQ(test::error_of([&] { open_weight_source(dir.path()); }),
            "directory '" + dir.path() +
                "' holds no checkpoint: expected kernel_format.json, "
                "model.safetensors.index.json, *.safetensors or one .h5/.hdf5 file");
  test::write_file(dir / "notes.txt", "hello");
  EXPECT_EQ(test::error_of([&] { open_weight_source(dir / "notes.txt"); }),
            "checkpoint '" + (dir / "notes.txt") +
                "': not a .safetensors, .h5/.hdf5 or HDF5 "
                "file, nor a checkpoint directory");
  write_hdf5(dir / "a.h5", test::as_memory(two_tensors()));
  write_hdf5(dir / "b.h5", test::as_memory(two_tensors()));
  EXPECT_EQ(test::error_of([&] { open_weight_source(dir.path()); }),
            "directory '" + dir.path() + "' holds 2 HDF5 files ('a.h5', 'b.h5'); name one of them");
  // Three are named; more are counted.
  for (const char* name : {"c.hdf5", "d.h5"})
    write_hdf5(dir / name, test::as_memory(two_tensors()));
  EXPECT_EQ(test::error_of([&] { open_weight_source(dir.path()); }),
            "directory '" + dir.path() +
                "' holds 4 HDF5 files ('a.h5', 'b.h5', 'd.h5', ...); name one of them");
  // Safetensors beside an HDF5 file (a Hugging Face repository's TensorFlow
  // tf_model.h5): the safetensors are the checkpoint.
  TempDir both;
  write_safetensors(both / "model.safetensors", test::as_memory(two_tensors()));
  write_hdf5(both / "tf_model.h5", test::as_memory(two_tensors()));
  EXPECT_NE(open_weight_source(both.path())->describe().find("safetensors"), std::string::npos);
}

}  // namespace
}  // namespace tpreload
