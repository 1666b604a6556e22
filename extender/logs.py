"""The extender's logging set-up lives in `livedata.logs`, shared with the controllers.

Kept so that `extender.config` (restructured in parallel) still finds `LOG_FORMATS` here; once
it imports `livedata.logs` itself this module can go.
"""

from livedata.logs import LOG_FORMATS, configure_logging

__all__ = ["LOG_FORMATS", "configure_logging"]
