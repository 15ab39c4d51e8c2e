// What `unet train` and `unet train-classifier` share: their arguments, the flags of the training
// loop (both), and the command itself (train.cpp; the classifier's flags in train_classifier.cpp).
#pragma once
#include <string>

#include "commands.h"
#include "trainer.h"

namespace unet {

struct TrainArgs {
  bool classifier = false;  // train-classifier
  std::string data, init, resume, rundir;
  TrainOptions opt;
  bool no_flip = false;
  ModelFlags model;        // unet train
  ClassifierFlags cmodel;  // unet train-classifier
  DeviceFlags dev;
  int gpus = 0;              // --gpus N: launch N local ranks
  double dist_timeout = 60;  // --dist-timeout
  CLI::App* app = nullptr;
  CLI::Option* class_dropout_opt = nullptr;  // unet train
};

// The data, checkpoint, loop, run-directory, distributed and device flags (set a->classifier and
// the option defaults first); the network's flags are added by the command.
void add_train_flags(CLI::App* sub, TrainArgs* a);
// A training setting's flag validator: the range (resume.h train_setting_range) a value recorded
// in a resumed checkpoint is checked against too.
CLI::Validator setting_check(const char* flag);
void run_train(TrainArgs& a);

}  // namespace unet
