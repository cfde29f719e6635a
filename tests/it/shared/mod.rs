//! What every side shares (`src/shared/`): the decoders that face input.

mod fuzz_decoders;
