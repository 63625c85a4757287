"""A stand-in for the `aws` resource provider plugin, for previews only: the real one (pulumi-aws) cannot be built
here, and a preview needs a plugin to answer for every AWS resource.

It checks nothing and computes nothing: `Check` returns the inputs as the program sent them (the SDK's camelCase
names, secrets and unknowns as they are) and a preview's outputs are those inputs, which is what the policy pack
judges at preview. The real provider adds defaults (tags_all, a name suffix) that no Triarch rule reads. It refuses
to create anything: it exists for `pulumi preview`.

Run by the Pulumi engine as `pulumi-resource-aws <engine address>`, installed with `pulumi plugin install resource
aws <version> --file <a script that runs this file>`."""

from __future__ import annotations

import sys
from importlib.metadata import version

from pulumi.provider.experimental.provider import (
    CheckRequest,
    CheckResponse,
    ConfigureRequest,
    ConfigureResponse,
    CreateRequest,
    CreateResponse,
    DiffRequest,
    DiffResponse,
    Provider,
)
from pulumi.provider.experimental.server import main


class PreviewOnlyAws(Provider):
    async def check_config(self, request: CheckRequest) -> CheckResponse:
        return CheckResponse(inputs=request.new_inputs)

    async def diff_config(self, request: DiffRequest) -> DiffResponse:
        return DiffResponse()

    async def configure(self, request: ConfigureRequest) -> ConfigureResponse:
        return ConfigureResponse(accept_secrets=True, supports_preview=True)

    async def check(self, request: CheckRequest) -> CheckResponse:
        return CheckResponse(inputs=request.new_inputs)

    async def diff(self, request: DiffRequest) -> DiffResponse:
        return DiffResponse()

    async def create(self, request: CreateRequest) -> CreateResponse:
        if not request.preview:
            raise RuntimeError("the aws stand-in only previews; it creates nothing")
        return CreateResponse(properties=request.properties)


if __name__ == "__main__":  # the version of the SDK the programs import, which is the plugin version they ask for
    main(sys.argv[1:], version("pulumi_aws"), PreviewOnlyAws())
