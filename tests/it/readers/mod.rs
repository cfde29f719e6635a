//! The readers (`src/readers/`): `logmon logs`, the capture times and
//! their properties, and the readers against a hostile task.

mod hostile_readers;
mod logs;
mod timeline;
mod timeline_props;
