// Fixture base of the server tests (server_api_test.cpp, server_http_test.cpp): each test suite loads
// stories260K once and shares it read-only among its tests (a model is immutable after loading).
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "model/model.h"

namespace kvpack::test {

inline const std::string kStoriesModel = std::string(KVPACK_SHARED_DIR) + "/models/stories260K.gguf";

class StoriesModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = Model::load(kStoriesModel).release(); }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  static inline Model* model_ = nullptr;
};

}  // namespace kvpack::test
