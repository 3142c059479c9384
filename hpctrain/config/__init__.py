"""Site configs and job specs (pydantic models) and their loading. Names load on first use: a command that reads only
the site config does not build the job spec's models."""

from typing import TYPE_CHECKING

from hpctrain.lazy import lazy_exports

if TYPE_CHECKING:  # the names' types, which the lazy __getattr__ would leave Any
    from hpctrain.config.job import JobSpec as JobSpec
    from hpctrain.config.job import load_job_spec as load_job_spec
    from hpctrain.config.site import SiteConfig as SiteConfig
    from hpctrain.config.site import load_site as load_site

_EXPORTS = {"JobSpec": "job", "load_job_spec": "job", "SiteConfig": "site", "load_site": "site"}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
