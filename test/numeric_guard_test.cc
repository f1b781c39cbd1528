// NumericGuard (src/runtime/numeric_guard.h) as an object: no job, no
// controller.
#include "src/runtime/numeric_guard.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <map>
#include <string>

namespace {

using Metrics = std::map<std::string, double>;

}  // namespace

TEST_CASE("numeric guard: a value the trainer reported wins and names itself") {
  holdfast::NumericGuard g;
  holdfast::NumericChecks checks;
  g.BeginStep(40);
  g.ReportNonFinite("grad of layer 2");
  g.ReportNonFinite("a later one");
  auto a = g.Check(checks, 5, 2, 50,
                   {{"loss", std::numeric_limits<double>::quiet_NaN()}});
  REQUIRE(a.has_value());
  CHECK(a->kind() == "nan");
  CHECK(a->what() == "grad of layer 2");
  CHECK(a->local());
  CHECK(a->step() == 5);
  CHECK(a->data().begin() == 40);
  CHECK(a->data().end() == 50);
  // Reported once: the next step starts clean.
  g.BeginStep(50);
  CHECK_FALSE(g.Check(checks, 6, 2, 60, {{"loss", 1.0}}).has_value());
}

TEST_CASE("numeric guard: a metric that is not finite with no data position") {
  holdfast::NumericGuard g;
  holdfast::NumericChecks checks;
  g.BeginStep(0);
  auto a = g.Check(checks, 3, 2, -1,
                   {{"grad_norm", std::numeric_limits<double>::infinity()}});
  REQUIRE(a.has_value());
  CHECK(a->what() == "grad_norm");
  CHECK_FALSE(a->local());
  CHECK_FALSE(a->has_data());
  checks.check_finite = false;
  CHECK_FALSE(g.Check(checks, 3, 2, -1,
                      {{"grad_norm", std::numeric_limits<double>::infinity()}})
                  .has_value());
}

TEST_CASE("numeric guard: a loss spike counts only after the warm-up") {
  holdfast::NumericGuard g;
  holdfast::NumericChecks checks;
  checks.spike_factor = 10;
  checks.spike_warmup = 3;
  checks.spike_window = 5;
  // Before the warm-up a jump is taken as a loss like any other.
  CHECK_FALSE(g.Check(checks, 1, 2, -1, Metrics{{"loss", 1.0}}).has_value());
  CHECK_FALSE(g.Check(checks, 2, 2, -1, Metrics{{"loss", 50.0}}).has_value());
  CHECK_FALSE(g.Check(checks, 3, 2, -1, Metrics{{"loss", 1.0}}).has_value());
  CHECK_FALSE(g.Check(checks, 4, 2, -1, Metrics{{"loss", 1.0}}).has_value());
  // The median of {1, 50, 1, 1} is 1: 9 is not a spike, and is recorded.
  CHECK_FALSE(g.Check(checks, 5, 2, -1, Metrics{{"loss", 9.0}}).has_value());
  // The median of {1, 50, 1, 1, 9} is 1: 11 is.
  auto a = g.Check(checks, 6, 2, -1, Metrics{{"loss", 11.0}});
  REQUIRE(a.has_value());
  CHECK(a->kind() == "spike");
  CHECK(a->value() == 11.0);
  // A spike is not recorded: the median stays where it was.
  CHECK(g.Check(checks, 6, 2, -1, Metrics{{"loss", 11.0}}).has_value());
}
