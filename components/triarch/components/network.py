"""VPC for a created cluster: private subnets for nodes, public subnets for load balancers and NAT."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from triarch.addressing import plan_subnets
from triarch.config import ClusterConfig
from triarch.planners.karpenter import DISCOVERY_TAG


def nat_zones(cluster: ClusterConfig) -> list[str]:
    """Where the NAT gateways go: every zone, or (single) the zone first by letter, whatever the list's order, so
    reordering the zones never moves the NAT gateway and its public address."""
    return list(cluster.zones) if cluster.nat_gateways == "perZone" else [min(cluster.zones)]


def s3_service(region: str) -> str:
    """The S3 gateway endpoint's service in a region (the VPC User Guide, "Gateway endpoints for Amazon S3")."""
    return f"com.amazonaws.{region}.s3"


class Network(pulumi.ComponentResource):
    def __init__(self, name: str, cluster: ClusterConfig, region: str,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("triarch:network:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        cluster_tag = {f"kubernetes.io/cluster/{cluster.name}": "shared"}

        self.vpc = aws.ec2.Vpc(f"{name}-vpc", cidr_block=str(cluster.vpc_cidr), enable_dns_hostnames=True,
                               enable_dns_support=True, tags={"Name": cluster.name}, opts=child)
        # The default security group of a new VPC allows all traffic between members: take its rules away.
        self.default_security_group = aws.ec2.DefaultSecurityGroup(f"{name}-default-sg", vpc_id=self.vpc.id,
                                                                   opts=child)
        self.internet_gateway = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=self.vpc.id,
                                                        tags={"Name": cluster.name}, opts=child)
        self.public_route_table = aws.ec2.RouteTable(
            f"{name}-public", vpc_id=self.vpc.id,
            routes=[{"cidr_block": "0.0.0.0/0", "gateway_id": self.internet_gateway.id}],
            tags={"Name": f"{cluster.name}-public"}, opts=child)

        self.public_subnets: list[aws.ec2.Subnet] = []
        self.private_subnets: list[aws.ec2.Subnet] = []
        self.nat_gateways: list[aws.ec2.NatGateway] = []
        self.private_subnet_by_zone: dict[str, aws.ec2.Subnet] = {}
        plans = plan_subnets(cluster.vpc_cidr, cluster.zones)
        nat_by_zone: dict[str, aws.ec2.NatGateway] = {}
        for plan in plans:
            public = aws.ec2.Subnet(
                f"{name}-public-{plan.zone}", vpc_id=self.vpc.id, cidr_block=plan.public_cidr,
                availability_zone=plan.zone, map_public_ip_on_launch=False,
                tags={"Name": f"{cluster.name}-public-{plan.zone}", "kubernetes.io/role/elb": "1", **cluster_tag},
                opts=child)
            aws.ec2.RouteTableAssociation(f"{name}-public-{plan.zone}", subnet_id=public.id,
                                          route_table_id=self.public_route_table.id, opts=child)
            self.public_subnets.append(public)
            if plan.zone in nat_zones(cluster):
                eip = aws.ec2.Eip(f"{name}-nat-{plan.zone}", domain="vpc", tags={"Name": f"{cluster.name}-nat"},
                                  opts=child)
                nat_by_zone[plan.zone] = aws.ec2.NatGateway(
                    f"{name}-nat-{plan.zone}", allocation_id=eip.id, subnet_id=public.id,
                    tags={"Name": f"{cluster.name}-nat-{plan.zone}"},
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[self.internet_gateway]))
        self.nat_gateways = [nat_by_zone[z] for z in sorted(nat_by_zone)]
        private_route_tables: dict[str, aws.ec2.RouteTable] = {}
        for plan in plans:
            private = aws.ec2.Subnet(
                f"{name}-private-{plan.zone}", vpc_id=self.vpc.id, cidr_block=plan.private_cidr,
                availability_zone=plan.zone,
                tags={"Name": f"{cluster.name}-private-{plan.zone}", "kubernetes.io/role/internal-elb": "1",
                      DISCOVERY_TAG: cluster.name, **cluster_tag},
                opts=child)
            nat = nat_by_zone.get(plan.zone) or self.nat_gateways[0]
            route_table = aws.ec2.RouteTable(
                f"{name}-private-{plan.zone}", vpc_id=self.vpc.id,
                routes=[{"cidr_block": "0.0.0.0/0", "nat_gateway_id": nat.id}],
                tags={"Name": f"{cluster.name}-private-{plan.zone}"}, opts=child)
            aws.ec2.RouteTableAssociation(f"{name}-private-{plan.zone}", subnet_id=private.id,
                                          route_table_id=route_table.id, opts=child)
            self.private_subnets.append(private)
            self.private_subnet_by_zone[plan.zone] = private
            private_route_tables[plan.zone] = route_table
        # S3 from the private subnets through a gateway endpoint (no charge), not the NAT gateways (charged per GB):
        # weights streamed from s3:// at every replica start, and ECR's image layers, which ECR serves from S3.
        # Buckets of the VPC's region only; a bucket elsewhere still goes through the NAT.
        self.s3_endpoint = aws.ec2.VpcEndpoint(
            f"{name}-s3", vpc_id=self.vpc.id, service_name=s3_service(region), vpc_endpoint_type="Gateway",
            route_table_ids=[private_route_tables[zone].id for zone in sorted(private_route_tables)],
            tags={"Name": f"{cluster.name}-s3"}, opts=child)

        self.register_outputs({"vpcId": self.vpc.id,
                               "privateSubnetIds": [s.id for s in self.private_subnets]})
