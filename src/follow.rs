// follow: built by the logs issue
